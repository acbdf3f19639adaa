//! Bounds shared by every connection of one server: payload bytes in flight
//! daemon-wide, connections still in the handshake, and rate-limited
//! logging of misbehaving clients. Per-connection bounds live in
//! `transmission`; these keep the sum over 1,024 connections bounded too.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::warn;

use crate::sink::Sink;
use crate::stats::{stats, ServerStats};
use crate::ServerConfig;

/// A request that has waited this long for the daemon-wide byte budget
/// makes the server close the most stalled connection (one whose socket
/// took none of its queued replies for at least as long), so clients that
/// never read their replies cannot keep the budget from everyone else.
pub(crate) const EVICT_AFTER: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Shared {
    /// Payload bytes of READ/WRITE requests in flight, all connections.
    bytes: Arc<Semaphore>,
    /// Sinks of connections in transmission, for [`Shared::evict_stalled`].
    sinks: Mutex<HashMap<u64, Weak<Sink>>>,
    /// Connections in the handshake, oldest first.
    handshakes: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    next_id: Mutex<u64>,
    max_handshakes: usize,
    pub(crate) log: BadClients,
}

impl Shared {
    pub(crate) fn new(cfg: &ServerConfig) -> Arc<Shared> {
        let total = cfg.max_in_flight_bytes_total.clamp(
            crate::proto::MAX_PAYLOAD as usize,
            Semaphore::MAX_PERMITS >> 1,
        );
        Arc::new(Shared {
            bytes: Arc::new(Semaphore::new(total)),
            sinks: Mutex::new(HashMap::new()),
            handshakes: Mutex::new(VecDeque::new()),
            next_id: Mutex::new(0),
            max_handshakes: cfg.max_handshakes.max(1),
            log: BadClients::new(cfg.bad_client_log_interval),
        })
    }

    fn id(&self) -> u64 {
        let mut n = lock(&self.next_id);
        *n += 1;
        *n
    }

    /// Takes `n` bytes of the daemon-wide budget; while waiting, closes a
    /// stalled connection every [`EVICT_AFTER`] (not `me`).
    pub(crate) async fn acquire_bytes(
        &self,
        n: u32,
        me: &Arc<Sink>,
    ) -> Option<OwnedSemaphorePermit> {
        loop {
            match tokio::time::timeout(EVICT_AFTER, self.bytes.clone().acquire_many_owned(n)).await
            {
                Ok(p) => return p.ok(),
                Err(_) => self.evict_stalled(me),
            }
        }
    }

    /// Registers a connection's sink; unregistered when the guard drops.
    pub(crate) fn register_sink(self: &Arc<Self>, sink: &Arc<Sink>) -> SinkGuard {
        let id = self.id();
        lock(&self.sinks).insert(id, Arc::downgrade(sink));
        SinkGuard {
            shared: self.clone(),
            id,
        }
    }

    /// Closes every connection whose socket took none of its queued
    /// replies for [`EVICT_AFTER`] (not `me`), giving their permits back.
    /// All of them, not the worst one: the waiters queue in order, so a
    /// real client behind many stalled ones would otherwise wait a second
    /// per stalled client.
    fn evict_stalled(&self, me: &Arc<Sink>) {
        let victims: Vec<(usize, Arc<Sink>)> = {
            let sinks = lock(&self.sinks);
            sinks
                .values()
                .filter_map(Weak::upgrade)
                .filter(|s| !Arc::ptr_eq(s, me))
                .filter_map(|s| s.stalled_for(EVICT_AFTER).map(|b| (b, s)))
                .collect()
        };
        for (bytes, sink) in victims {
            ServerStats::add(&stats().stalled_evicted, 1);
            self.log.report(
                "stalled client evicted",
                sink.peer(),
                &format_args!(
                    "{bytes} reply bytes unread for {EVICT_AFTER:?} while the in-flight byte budget is exhausted"
                ),
            );
            sink.abort();
        }
    }

    /// Admits a new connection to the handshake; if `max_handshakes` are
    /// already in it, the oldest is told to give up (its socket is closed)
    /// so that idle or slow sockets cannot lock real clients out.
    pub(crate) fn admit_handshake(self: &Arc<Self>) -> HandshakeSlot {
        let id = self.id();
        let cancel = Arc::new(Notify::new());
        let mut q = lock(&self.handshakes);
        while q.len() >= self.max_handshakes {
            if let Some((_, oldest)) = q.pop_front() {
                // Stores a permit if the task is not waiting yet.
                oldest.notify_one();
                ServerStats::add(&stats().handshakes_evicted, 1);
            }
        }
        q.push_back((id, cancel.clone()));
        HandshakeSlot {
            shared: self.clone(),
            id,
            cancel,
        }
    }
}

pub(crate) struct SinkGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        lock(&self.shared.sinks).remove(&self.id);
    }
}

/// A connection's place among those in the handshake.
pub(crate) struct HandshakeSlot {
    shared: Arc<Shared>,
    id: u64,
    cancel: Arc<Notify>,
}

impl HandshakeSlot {
    /// Resolves when a newer connection needed this one's place.
    pub(crate) async fn evicted(&self) {
        self.cancel.notified().await
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut q = lock(&self.shared.handshakes);
        if let Some(i) = q.iter().position(|(id, _)| *id == self.id) {
            q.remove(i);
        }
    }
}

/// Rate-limited warnings about clients that break the protocol, time out,
/// or are evicted: the first event of an interval is logged in full, the
/// rest are counted and summarized in one line when the interval ends, so
/// a flood of bad connections cannot flood the log.
pub(crate) struct BadClients {
    interval: Duration,
    st: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    start: Option<Instant>,
    suppressed: BTreeMap<&'static str, u64>,
}

impl BadClients {
    pub(crate) fn new(interval: Duration) -> Self {
        BadClients {
            interval,
            st: Mutex::new(Window::default()),
        }
    }

    pub(crate) fn report(
        &self,
        kind: &'static str,
        peer: Option<SocketAddr>,
        detail: &dyn Display,
    ) {
        let now = Instant::now();
        let mut w = lock(&self.st);
        if w.start
            .is_some_and(|s| now.duration_since(s) < self.interval)
        {
            *w.suppressed.entry(kind).or_default() += 1;
            return;
        }
        let summary = Self::take_summary(&mut w);
        w.start = Some(now);
        drop(w);
        if let Some(s) = summary {
            warn!("{s}");
        }
        match peer {
            Some(peer) => warn!(%peer, "{kind}: {detail}"),
            None => warn!("{kind}: {detail}"),
        }
    }

    /// Logs the summary of an interval that has ended (called periodically).
    pub(crate) fn flush(&self) {
        let mut w = lock(&self.st);
        if w.start
            .is_some_and(|s| s.elapsed() >= self.interval && !w.suppressed.is_empty())
        {
            let summary = Self::take_summary(&mut w);
            w.start = None;
            drop(w);
            if let Some(s) = summary {
                warn!("{s}");
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn suppressed(&self) -> u64 {
        lock(&self.st).suppressed.values().sum()
    }

    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    fn take_summary(w: &mut Window) -> Option<String> {
        if w.suppressed.is_empty() {
            return None;
        }
        let total: u64 = w.suppressed.values().sum();
        let parts: Vec<String> = w
            .suppressed
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        let secs = w.start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        w.suppressed.clear();
        Some(format!(
            "{total} more misbehaving NBD clients in the last {secs:.0}s (not logged one by one): {}",
            parts.join(", ")
        ))
    }
}

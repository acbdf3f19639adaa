//! Transmission phase: read requests, run each on the blocking pool, send
//! replies through the connection's [`Sink`].
//!
//! ```text
//!  reader (this task) --spawn_blocking--> handler --Sink::send--> socket
//!         \------------- early error replies ---------/     (drain task if full)
//! ```
//! The reader bounds the work in flight per connection by two semaphores
//! (request count, payload bytes); the permits travel with the request and
//! are released once its reply is on the wire, so memory held by queued
//! replies is bounded too.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{watch, Semaphore};
use tracing::debug;

use crate::handshake::Negotiated;
use crate::limits::{BadClients, Shared};
use crate::proto::*;
use crate::sink::{encode_to_vec, Permits, ReadMode, Reply, Sink, Wire};
use crate::stats::{stats, ServerStats};
use crate::{
    BlockExport, ExportError, FlushDone, FlushStart, ReadChunk, ServerConfig, StatusExtent,
};

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// The client closed the connection between requests.
    Eof,
    /// The server is shutting down.
    Shutdown,
    /// The client broke the protocol (hard disconnect).
    Protocol(String),
    /// Reading from or writing to the socket failed.
    Io(io::Error),
    /// The export was taken away; requests got `NBD_ESHUTDOWN` for the grace period.
    Revoked,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Disconnect => write!(f, "client disconnected (NBD_CMD_DISC)"),
            End::Eof => write!(f, "client closed the connection"),
            End::Shutdown => write!(f, "server shutdown"),
            End::Protocol(m) => write!(f, "protocol violation: {m}"),
            End::Io(e) => write!(f, "i/o error: {e}"),
            End::Revoked => write!(f, "export revoked by the server"),
        }
    }
}

/// What every handler of one connection needs.
struct Session {
    export: Arc<dyn BlockExport>,
    structured: bool,
    contexts: Vec<(u32, String)>,
    revoked: Option<watch::Receiver<bool>>,
}

/// The message of every `NBD_ESHUTDOWN` sent once the export is revoked.
const REVOKED: &str =
    "the export was closed by the server (its dataset is being destroyed, rolled back or exported)";

impl Session {
    fn is_revoked(&self) -> bool {
        self.revoked.as_ref().is_some_and(|r| *r.borrow())
    }
}

/// A failed request: errno, message, and the offset for `ERROR_OFFSET`.
struct Fail {
    errno: u32,
    message: String,
    offset: Option<u64>,
}

impl Fail {
    fn new(errno: u32, message: impl Into<String>) -> Fail {
        Fail {
            errno,
            message: message.into(),
            offset: None,
        }
    }
    /// An error from the export while working on a request at `offset`.
    fn export(e: ExportError, offset: u64, len: u64) -> Fail {
        Fail {
            errno: errno_of(&e),
            message: e.to_string(),
            offset: (len > 0).then_some(offset),
        }
    }
}

fn error_reply(structured: bool, handle: u64, f: Fail) -> Reply {
    ServerStats::add(&stats().errors, 1);
    if structured {
        Reply::Error {
            handle,
            error: f.errno,
            message: f.message,
            offset: f.offset,
        }
    } else {
        Reply::Simple {
            handle,
            error: f.errno,
        }
    }
}

/// Runs the transmission phase until the client disconnects, breaks the
/// protocol, or the server shuts down; all replies for requests already
/// read are sent (or the socket has failed) before this returns.
pub(crate) async fn run<R>(
    mut rd: tokio::io::BufReader<R>,
    wr: Wire,
    peer: Option<std::net::SocketAddr>,
    neg: Negotiated,
    mut shutdown: watch::Receiver<bool>,
    cfg: &ServerConfig,
    shared: &Arc<Shared>,
) -> End
where
    R: AsyncRead + Unpin,
{
    let revoked_rx = neg.export.revoked();
    let session = Arc::new(Session {
        export: neg.export,
        structured: neg.structured,
        contexts: neg.contexts,
        revoked: revoked_rx.clone(),
    });
    let max_in_flight = cfg.max_in_flight.clamp(1, 1 << 16);
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let budget = cfg
        .max_in_flight_bytes
        .clamp(MAX_PAYLOAD as usize, Semaphore::MAX_PERMITS >> 1);
    let bytes = Arc::new(Semaphore::new(budget));
    let (sink, drain, mut broken) = Sink::start(wr, peer);
    let _registered = shared.register_sink(&sink);
    let mut drain = AbortOnDrop(drain);
    let dispatcher = Arc::new(Dispatcher::new(
        session.clone(),
        sink.clone(),
        cfg.max_workers.min(max_in_flight),
    ));
    let st = stats();
    // Resolves when the connection must stop for outside reasons; created
    // once (not per request) so its wake-up registrations are made once.
    let stop = async {
        tokio::select! {
            _ = crate::server::shutdown_requested(&mut shutdown) => End::Shutdown,
            _ = broken.wait_for(|b| *b) => End::Io(io::ErrorKind::BrokenPipe.into()),
        }
    };
    tokio::pin!(stop);
    // Resolves once the export is revoked; then requests are answered with
    // ESHUTDOWN (`draining`) until `revoke_deadline`, and the connection ends.
    let revoked = async move {
        let fired = match revoked_rx {
            Some(mut rx) => rx.wait_for(|v| *v).await.is_ok(),
            None => false,
        };
        if !fired {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(revoked);
    let mut draining = false;
    let revoke_deadline = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(revoke_deadline);

    // Armed while queued jobs wait for busy workers without a new one having
    // been started: if they still wait when it fires, one is started.
    let rebalance = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(rebalance);
    let mut rebalance_armed = false;
    // The payload buffer of the last WRITE done on this task, for the next
    // one (decision 0075: no allocation per small WRITE).
    let mut spare: Vec<u8> = Vec::new();

    let end = 'conn: loop {
        // ---- request header (cancel-safe: a single `read` either reads or
        // not, and `filled` survives the timer branch)
        let mut hdr = [0u8; Request::SIZE];
        let mut filled = 0;
        while filled < hdr.len() {
            let n = tokio::select! {
                biased;
                r = rd.read(&mut hdr[filled..]) => match r {
                    Ok(n) => n,
                    Err(e) => break 'conn End::Io(e),
                },
                e = &mut stop => break 'conn e,
                _ = &mut revoked, if !draining => {
                    draining = true;
                    revoke_deadline.as_mut().reset(tokio::time::Instant::now() + cfg.revoke_grace);
                    continue;
                }
                _ = &mut revoke_deadline, if draining => break 'conn End::Revoked,
                _ = &mut rebalance, if rebalance_armed => {
                    rebalance_armed = dispatcher.rebalance();
                    if rebalance_armed {
                        rebalance.as_mut().reset(tokio::time::Instant::now() + REBALANCE_AFTER);
                    }
                    continue;
                }
            };
            if n == 0 {
                if filled == 0 {
                    break 'conn End::Eof;
                }
                break 'conn End::Protocol(format!(
                    "truncated request header ({filled} of {} bytes)",
                    hdr.len()
                ));
            }
            filled += n;
        }
        let req = match Request::parse(&hdr) {
            Ok(r) => r,
            Err(magic) => break End::Protocol(format!("bad request magic {magic:#010x}")),
        };
        st.count_request(req.command);
        let structured = session.structured;
        let early =
            |f: Fail, permits: Permits| sink.send(error_reply(structured, req.handle, f), permits);

        if req.command == Command::Disc {
            break End::Disconnect;
        }
        // ---- flow control: every request (error replies too) holds a slot
        // until its reply is on the wire. Waiting here means the client has
        // the maximum in flight, or is not reading its replies.
        // Per connection first, then daemon-wide: a connection waiting for
        // its own budget does not hold any of everyone's.
        let cost = match req.command {
            Command::Read | Command::Write if req.len <= MAX_PAYLOAD && !draining => req.len,
            _ => 0,
        };
        let acquire = || async {
            let slot = slots.clone().acquire_owned().await.ok()?;
            let (bytes, global) = if cost > 0 {
                let b = bytes.clone().acquire_many_owned(cost).await.ok()?;
                (Some(b), Some(shared.acquire_bytes(cost, &sink).await?))
            } else {
                (None, None)
            };
            Some(Permits {
                _slot: Some(slot),
                bytes,
                global,
            })
        };
        let permits = loop {
            tokio::select! {
                biased;
                p = acquire() => match p {
                    Some(p) => break p,
                    None => break 'conn End::Shutdown,
                },
                e = &mut stop => break 'conn e,
                _ = &mut revoke_deadline, if draining => break 'conn End::Revoked,
                _ = &mut rebalance, if rebalance_armed => {
                    rebalance_armed = dispatcher.rebalance();
                    if rebalance_armed {
                        rebalance.as_mut().reset(tokio::time::Instant::now() + REBALANCE_AFTER);
                    }
                }
            }
        };

        // ---- revoked: every request gets ESHUTDOWN (a WRITE's payload is
        // skipped), none reaches the export.
        if draining || session.is_revoked() {
            if !draining {
                draining = true;
                revoke_deadline
                    .as_mut()
                    .reset(tokio::time::Instant::now() + cfg.revoke_grace);
            }
            if req.command == Command::Write {
                if req.len > MAX_PAYLOAD {
                    break End::Revoked;
                }
                let mut take = (&mut rd).take(u64::from(req.len));
                match tokio::io::copy(&mut take, &mut tokio::io::sink()).await {
                    Ok(n) if n == u64::from(req.len) => {}
                    Ok(_) => break End::Revoked,
                    Err(e) => break End::Io(e),
                }
            }
            early(Fail::new(ESHUTDOWN, REVOKED), permits);
            continue;
        }

        // ---- checks that need no export call, then the payload
        match check_header(&req, structured) {
            Ok(()) => {}
            Err(Refused::Answer(f)) => {
                early(f, permits);
                continue;
            }
            Err(Refused::Disconnect(f)) => {
                let msg = f.message.clone();
                early(f, permits);
                break End::Protocol(msg);
            }
        }

        let payload = if req.command == Command::Write {
            match read_payload(&mut rd, req.len as usize, &mut spare).await {
                Ok(p) => p,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    break End::Protocol(format!(
                        "truncated WRITE payload (expected {} bytes)",
                        req.len
                    ))
                }
                Err(e) => break End::Io(e),
            }
        } else {
            Vec::new()
        };

        if let Err(f) = check_flags(&req, structured) {
            early(f, permits);
            continue;
        }

        // ---- a READ of cached data is answered right here (decision 0062):
        // no hand-off to a worker thread and back. Not over TLS: sealing a
        // large reply stays on the workers (decision 0043), so the reader
        // goes on reading requests meanwhile.
        if req.command == Command::Read
            && req.len > 0
            && req.len <= INLINE_READ_MAX
            && !sink.is_tls()
        {
            if let Some(reply) = try_read_inline(&session, &req) {
                // The client's next request is already here: its reply
                // follows at once, so this one waits for it in the sink's
                // queue and the drain writes them together (decision 0074).
                // The last reply of a burst goes out as before, so a client
                // with one request in flight waits for no hand-off.
                if rd.buffer().len() >= Request::SIZE {
                    sink.queue(reply, permits);
                } else {
                    sink.send(reply, permits);
                }
                continue;
            }
        }

        // ---- a small WRITE runs right here if the export can take it
        // without blocking (decision 0053): no hand-off to a worker thread,
        // the reply goes out from this task. With FUA, the write is then
        // made durable like a FLUSH that holds no thread (decisions 0057,
        // 0061): its reply goes out once the log holds it, or a worker
        // runs the blocking flush and replies under the write's handle.
        if req.command == Command::Write && req.len <= INLINE_WRITE_MAX {
            if let Some(reply) = try_write_inline(&session, &req, &payload) {
                // The export copied the bytes: the buffer serves the next WRITE.
                spare = payload;
                let mut permits = permits;
                permits.release_bytes();
                let written = matches!(reply, Reply::Simple { error: 0, .. });
                if req.flags & CMD_FLAG_FUA != 0 && written && !session.is_revoked() {
                    let flush = Request {
                        command: Command::Flush,
                        flags: 0,
                        offset: 0,
                        len: 0,
                        ..req
                    };
                    let job = Job {
                        req: flush,
                        payload: Vec::new(),
                        permits,
                        drive: None,
                    };
                    if catch_unwind(AssertUnwindSafe(|| dispatcher.start_flush(job))).is_err() {
                        tracing::error!("export panicked (flush)");
                        break End::Io(io::Error::other("export panicked"));
                    }
                    continue;
                }
                sink.send(reply, permits);
                continue;
            }
        }

        let job = Job {
            req,
            payload,
            permits,
            drive: None,
        };
        // ---- a FLUSH holds no thread while it waits (decision 0057): it is
        // answered here if already durable, else by the thread whose log
        // write makes it durable.
        if req.command == Command::Flush && !session.is_revoked() {
            if catch_unwind(AssertUnwindSafe(|| dispatcher.start_flush(job))).is_err() {
                tracing::error!("export panicked (flush)");
                break End::Io(io::Error::other("export panicked"));
            }
            continue;
        }
        // ---- hand it to the connection's blocking workers
        if dispatcher.submit(job) && !rebalance_armed {
            rebalance_armed = true;
            rebalance
                .as_mut()
                .reset(tokio::time::Instant::now() + REBALANCE_AFTER);
        }
    };

    // Wait for every request in flight: a slot comes back once its reply is
    // on the wire (or dropped on a broken socket). Then let the drain task
    // finish what is queued; dropping the last sink reference closes the
    // write side. A client that stops reading its replies cannot hold the
    // connection open past the grace period.
    let finish = async {
        let _all = slots.acquire_many(max_in_flight as u32).await;
        sink.close();
        (&mut drain.0).await
    };
    let grace = if draining {
        cfg.revoke_grace
    } else {
        cfg.shutdown_grace
    };
    let res = tokio::time::timeout(grace, finish).await;
    // Let go of the export (and what it holds open) before the socket
    // closes (the last sink reference does that): a client that saw the
    // close may destroy the dataset at once. It waits for requests still
    // running, so off this thread.
    let export = session.export.clone();
    let _ = tokio::task::spawn_blocking(move || export.close()).await;
    dispatcher.close();
    drop(dispatcher);
    drop(sink);
    match res {
        Ok(Ok(Ok(()))) => end,
        Ok(Ok(Err(e))) => match end {
            End::Disconnect | End::Eof | End::Shutdown => End::Io(e),
            other => other,
        },
        Ok(Err(e)) => End::Io(io::Error::other(e)),
        Err(_) => match end {
            End::Protocol(m) => End::Protocol(m),
            _ => End::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "in-flight replies not delivered in time",
            )),
        },
    }
}

/// A request refused before its payload is read or the export is called.
enum Refused {
    /// Answer with this error and go on with the next request.
    Answer(Fail),
    /// Answer, then hard disconnect: the payload cannot be skipped safely.
    Disconnect(Fail),
}

/// Checks of a request header that need neither its payload nor the export.
fn check_header(req: &Request, structured: bool) -> Result<(), Refused> {
    match req.command {
        Command::Unknown(t) => Err(Refused::Answer(Fail::new(
            EINVAL,
            format!("unknown command {t}"),
        ))),
        Command::Write if req.len > MAX_PAYLOAD => Err(Refused::Disconnect(Fail::new(
            EINVAL,
            format!(
                "write of {} bytes exceeds the maximum payload {MAX_PAYLOAD}",
                req.len
            ),
        ))),
        Command::Read if req.len > MAX_PAYLOAD => {
            let errno = if structured { EOVERFLOW } else { EINVAL };
            Err(Refused::Answer(Fail::new(
                errno,
                format!(
                    "read of {} bytes exceeds the maximum payload {MAX_PAYLOAD}",
                    req.len
                ),
            )))
        }
        _ => Ok(()),
    }
}

/// Command flags the command does not take (checked once the payload is read).
fn check_flags(req: &Request, structured: bool) -> Result<(), Fail> {
    let bad = req.flags & !req.command.allowed_flags(structured);
    if bad != 0 {
        return Err(Fail::new(
            EINVAL,
            format!("flags {bad:#x} are not valid for {}", req.command.name()),
        ));
    }
    Ok(())
}

/// The transmission phase without a socket, for the fuzzer (crate::fuzzing):
/// decodes requests from `stream` as [`run`] does (header, the same checks,
/// the WRITE payload), executes each on `export` and returns the encoded
/// replies. Stops where [`run`] would end the connection.
pub(crate) fn run_on_bytes(
    export: Arc<dyn BlockExport>,
    structured: bool,
    contexts: Vec<(u32, String)>,
    mut stream: &[u8],
) -> Vec<Vec<u8>> {
    let session = Session {
        export,
        structured,
        contexts,
        revoked: None,
    };
    let mut replies = Vec::new();
    while stream.len() >= Request::SIZE {
        let (hdr, rest) = stream.split_at(Request::SIZE);
        stream = rest;
        let mut h = [0u8; Request::SIZE];
        h.copy_from_slice(hdr);
        let Ok(req) = Request::parse(&h) else { break };
        if req.command == Command::Disc {
            break;
        }
        let refused = match check_header(&req, structured) {
            Ok(()) => None,
            Err(Refused::Answer(f)) => Some((f, false)),
            Err(Refused::Disconnect(f)) => Some((f, true)),
        };
        if let Some((f, disconnect)) = refused {
            replies.push(encode_to_vec(&error_reply(structured, req.handle, f)));
            if disconnect {
                break;
            }
            continue;
        }
        let payload = if req.command == Command::Write {
            let n = req.len as usize;
            if stream.len() < n {
                break;
            }
            let (p, rest) = stream.split_at(n);
            stream = rest;
            p.to_vec()
        } else {
            Vec::new()
        };
        let reply = match check_flags(&req, structured) {
            Ok(()) => execute(&session, &req, payload),
            Err(f) => error_reply(structured, req.handle, f),
        };
        replies.push(encode_to_vec(&reply));
    }
    replies
}

/// Aborts the task when dropped (so an aborted connection takes its drain
/// task with it).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request ready to run.
struct Job {
    req: Request,
    payload: Vec<u8>,
    permits: Permits,
    /// Instead of the request: writes the intent log for deferred FLUSHes
    /// (decision 0057), on the connection's worker (no thread of its own).
    drive: Option<Box<dyn FnOnce() + Send>>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Workers alive (each is a `spawn_blocking` task).
    workers: usize,
    /// Workers executing a job right now.
    busy: usize,
    /// Workers waiting for a job, and how many of them were signalled.
    idle: usize,
    signalled: usize,
    /// FLUSH or FUA requests (expected to be slow) running, and queued.
    busy_sync: usize,
    queued_sync: usize,
    /// Moving average of the time a request takes to execute, in ns.
    service_ns: u64,
    /// The connection is over: workers exit once the queue is empty.
    closed: bool,
}

/// A new worker is started when the requests already queued would wait
/// longer than this for the busy workers (about the cost of a thread
/// hand-off): cheap requests are then run back to back by few threads,
/// slow ones in parallel.
const SPAWN_AFTER_NS: u64 = 30_000;
/// How long queued jobs may wait for busy workers before another worker is
/// started regardless of the service-time estimate.
const REBALANCE_AFTER: Duration = Duration::from_millis(1);
/// Service time assumed before any request finished.
const INITIAL_SERVICE_NS: u64 = 1_000_000;

fn is_sync(req: &Request) -> bool {
    req.command == Command::Flush || req.flags & CMD_FLAG_FUA != 0
}

/// How long a worker waits for the next job before giving its thread back.
const WORKER_LINGER: Duration = Duration::from_millis(5);

/// Runs a connection's requests on the blocking pool.
///
/// Workers are `spawn_blocking` tasks that take jobs from the connection's
/// queue; an idle worker waits a few milliseconds for the next job before
/// it returns its thread, so a busy connection hands requests to a waiting
/// thread through its own queue instead of paying a `spawn_blocking` per
/// request (whose pool lock all connections share). A new worker is
/// started only when more jobs wait than there are workers free to take
/// them and the wait would exceed [`SPAWN_AFTER_NS`] at the measured service
/// time (FLUSH/FUA requests in progress do not count as coming back soon),
/// up to [`ServerConfig::max_workers`]: fast requests run back to back on a
/// few threads, slow ones in parallel.
struct Dispatcher {
    queue: Mutex<Queue>,
    ready: Condvar,
    session: Arc<Session>,
    sink: Arc<Sink>,
    max_workers: usize,
    /// Workers may be started from outside the runtime (a FLUSH sent back
    /// to the blocking path by the log's thread).
    rt: tokio::runtime::Handle,
}

impl Dispatcher {
    fn new(session: Arc<Session>, sink: Arc<Sink>, max_workers: usize) -> Self {
        Dispatcher {
            queue: Mutex::new(Queue {
                service_ns: INITIAL_SERVICE_NS,
                ..Queue::default()
            }),
            ready: Condvar::new(),
            session,
            sink,
            max_workers: max_workers.max(1),
            rt: tokio::runtime::Handle::current(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a job in the queue and wakes an idle worker for it if there is
    /// one (returns whether it did).
    fn enqueue(&self, q: &mut Queue, job: Job) -> bool {
        q.queued_sync += usize::from(is_sync(&job.req));
        q.jobs.push_back(job);
        if q.idle > q.signalled {
            q.signalled += 1;
            self.ready.notify_one();
            true
        } else {
            false
        }
    }

    /// Queues a job, waking or starting a worker for it if that pays off.
    /// Returns true if jobs are left waiting for busy workers (see
    /// [`Dispatcher::rebalance`]).
    fn submit(self: &Arc<Self>, job: Job) -> bool {
        let (spawn, deferred) = {
            let mut q = self.lock();
            if self.enqueue(&mut q, job) {
                (false, false)
            } else if q.jobs.len() > q.workers - q.busy && q.workers < self.max_workers {
                // Workers that will come back soon for the queued jobs (a
                // queued FLUSH/FUA will hold one of them).
                let fast = q.workers.saturating_sub(q.busy_sync + q.queued_sync) as u64;
                let waiting = (q.jobs.len() - (q.workers - q.busy)) as u64;
                let spawn = fast == 0 || waiting * q.service_ns / fast > SPAWN_AFTER_NS;
                if spawn {
                    q.workers += 1;
                }
                (spawn, !spawn)
            } else {
                (false, false)
            }
        };
        if spawn {
            self.spawn_worker();
        }
        deferred
    }

    /// Called when jobs have waited [`REBALANCE_AFTER`] for busy workers
    /// (one of which may be stuck in a slow request the service-time average
    /// did not foresee): starts a worker if jobs still wait. Returns true if
    /// jobs still wait without a free worker.
    fn rebalance(self: &Arc<Self>) -> bool {
        let spawn = {
            let mut q = self.lock();
            let waiting = q.jobs.len() > q.workers - q.busy;
            if waiting && q.workers < self.max_workers {
                q.workers += 1;
                true
            } else {
                false
            }
        };
        if spawn {
            self.spawn_worker();
        }
        let q = self.lock();
        q.jobs.len() > q.workers - q.busy && q.workers < self.max_workers
    }

    fn spawn_worker(self: &Arc<Self>) {
        let d = self.clone();
        self.rt.spawn_blocking(move || d.work());
    }

    /// Starts a FLUSH through [`BlockExport::flush_start`]: its reply is
    /// sent by whoever finds it durable (this task, or the thread that
    /// wrote the log); if the export cannot do that, it runs on a worker
    /// like any request.
    fn start_flush(self: &Arc<Self>, job: Job) {
        let d = self.clone();
        let req = job.req;
        let done: FlushDone = Box::new(move |durable| {
            if durable {
                let reply = Reply::Simple {
                    handle: job.req.handle,
                    error: 0,
                };
                d.sink.send(reply, job.permits);
            } else {
                d.submit_later(job);
            }
        });
        match self.session.export.flush_start(done) {
            FlushStart::Done(done) => done(true),
            FlushStart::Queued => {}
            FlushStart::Drive(drive) => self.submit_later(Job {
                req,
                payload: Vec::new(),
                permits: Permits {
                    _slot: None,
                    bytes: None,
                    global: None,
                },
                drive: Some(drive),
            }),
            FlushStart::Blocking(done) => done(false),
        }
    }

    /// Queues a job from outside the reader's flow control (a FLUSH sent
    /// back to the blocking path, a log driver): wakes an idle worker or
    /// starts one.
    fn submit_later(self: &Arc<Self>, job: Job) {
        let spawn = {
            let mut q = self.lock();
            if self.enqueue(&mut q, job) {
                false
            } else if q.workers < self.max_workers {
                q.workers += 1;
                true
            } else {
                false
            }
        };
        if spawn {
            self.spawn_worker();
        }
    }

    /// Ends the workers once the queue is empty.
    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    fn work(&self) {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                let sync = is_sync(&job.req);
                q.queued_sync -= usize::from(sync);
                q.busy += 1;
                q.busy_sync += usize::from(sync);
                drop(q);
                let start = Instant::now();
                self.run(job);
                let took = start.elapsed().as_nanos().min(u128::from(u32::MAX)) as u64;
                q = self.lock();
                q.busy -= 1;
                q.busy_sync -= usize::from(sync);
                q.service_ns = (q.service_ns * 7 + took) / 8;
                continue;
            }
            if q.closed {
                break;
            }
            q.idle += 1;
            let (guard, res) = self
                .ready
                .wait_timeout(q, WORKER_LINGER)
                .unwrap_or_else(|e| e.into_inner());
            q = guard;
            q.idle -= 1;
            q.signalled = q.signalled.saturating_sub(1).min(q.idle);
            if res.timed_out() && q.jobs.is_empty() {
                break;
            }
        }
        q.workers -= 1;
    }

    fn run(&self, job: Job) {
        let Job {
            req,
            payload,
            mut permits,
            drive,
        } = job;
        if let Some(drive) = drive {
            if catch_unwind(AssertUnwindSafe(drive)).is_err() {
                tracing::error!("intent log driver panicked");
            }
            return;
        }
        let s = &*self.session;
        let reply = match catch_unwind(AssertUnwindSafe(|| execute(s, &req, payload))) {
            Ok(r) => r,
            Err(_) => {
                tracing::error!(
                    command = req.command.name(),
                    offset = req.offset,
                    len = req.len,
                    "export panicked"
                );
                error_reply(s.structured, req.handle, Fail::new(EIO, "internal error"))
            }
        };
        if req.command == Command::Write {
            // The payload is freed: only the slot waits for the reply.
            permits.release_bytes();
        }
        self.sink.send(reply, permits);
    }
}

/// Reads exactly `len` payload bytes without zero-filling the buffer first,
/// into `spare` if it is big enough and at most [`INLINE_WRITE_MAX`] (so a
/// connection keeps no large buffer), else into a new one.
async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
    spare: &mut Vec<u8>,
) -> io::Result<Vec<u8>> {
    let mut buf = if len <= spare.capacity() && spare.capacity() <= INLINE_WRITE_MAX as usize {
        let mut b = std::mem::take(spare);
        b.clear();
        b
    } else {
        Vec::with_capacity(len)
    };
    let mut take = rd.take(len as u64);
    while buf.len() < len {
        if take.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

fn in_range(offset: u64, len: u64, size: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

/// Largest WRITE tried on the reader task (decision 0053): small ones cost
/// less than the thread hand-off they save; large ones would hold the
/// reader (and the runtime thread) for their copy and hashing.
const INLINE_WRITE_MAX: u32 = 64 * 1024;

/// A WRITE (no FUA, payload read) done on the reader task through
/// [`BlockExport::try_write`]; `None`: it goes to a worker as usual (also
/// for every error the checks of [`execute`] report, so they stay in one place).
fn try_write_inline(s: &Session, req: &Request, payload: &[u8]) -> Option<Reply> {
    let (off, len) = (req.offset, u64::from(req.len));
    if len == 0 || s.is_revoked() {
        return None;
    }
    let e = &*s.export;
    let r = match catch_unwind(AssertUnwindSafe(|| {
        if e.read_only() || !in_range(off, len, e.size()) {
            return None;
        }
        e.try_write(off, payload)
    })) {
        Ok(r) => r?,
        Err(_) => {
            tracing::error!(offset = off, len, "export panicked (inline write)");
            return Some(error_reply(
                s.structured,
                req.handle,
                Fail::new(EIO, "internal error"),
            ));
        }
    };
    Some(match r {
        Ok(()) => {
            ServerStats::add(&stats().bytes_written, len);
            Reply::Simple {
                handle: req.handle,
                error: 0,
            }
        }
        Err(x) => {
            let f = Fail::export(x, off, len);
            debug!(command = "write", offset = off, len, errno = f.errno,
                message = %f.message, "request failed");
            error_reply(s.structured, req.handle, f)
        }
    })
}

/// Largest READ tried on the reader task (decision 0062): a cached read
/// costs the reader a lookup per block and the reply's socket write, which
/// is at least as much as a worker would pay; larger ones go to a worker so
/// the reader stays responsive.
const INLINE_READ_MAX: u32 = 4 << 20;

/// A READ served on the reader task through [`BlockExport::try_read`] when
/// its data needs no I/O; `None`: it goes to a worker as usual (also for
/// every error, so the checks of [`execute`] report them).
fn try_read_inline(s: &Session, req: &Request) -> Option<Reply> {
    let (off, len) = (req.offset, u64::from(req.len));
    if s.is_revoked() {
        return None;
    }
    let e = &*s.export;
    let chunks = match catch_unwind(AssertUnwindSafe(|| {
        if !in_range(off, len, e.size()) {
            return None;
        }
        e.try_read(off, len)
    })) {
        Ok(c) => c?,
        Err(_) => {
            tracing::error!(offset = off, len, "export panicked (inline read)");
            return None;
        }
    };
    read_reply(s, req, chunks).ok()
}

/// The reply to a READ the export answered with `chunks`.
fn read_reply(s: &Session, req: &Request, chunks: Vec<ReadChunk>) -> Result<Reply, Fail> {
    let (off, len) = (req.offset, u64::from(req.len));
    let mode = if !s.structured {
        ReadMode::Simple
    } else if req.flags & CMD_FLAG_DF != 0 {
        ReadMode::DontFragment
    } else {
        ReadMode::Structured
    };
    let chunks = normalize_read(chunks, len).map_err(|m| Fail {
        errno: EIO,
        message: m,
        offset: Some(off),
    })?;
    ServerStats::add(&stats().bytes_read, len);
    Ok(Reply::Read {
        handle: req.handle,
        offset: off,
        len: req.len,
        chunks,
        mode,
    })
}

/// Executes one request against the export (on the blocking pool).
fn execute(s: &Session, req: &Request, payload: Vec<u8>) -> Reply {
    let h = req.handle;
    match execute_inner(s, req, payload) {
        Ok(r) => r,
        Err(f) => {
            debug!(command = req.command.name(), offset = req.offset, len = req.len, errno = f.errno,
                message = %f.message, "request failed");
            error_reply(s.structured, h, f)
        }
    }
}

fn execute_inner(s: &Session, req: &Request, payload: Vec<u8>) -> Result<Reply, Fail> {
    if s.is_revoked() {
        return Err(Fail::new(ESHUTDOWN, REVOKED));
    }
    let e = &*s.export;
    let (h, off, len) = (req.handle, req.offset, u64::from(req.len));
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let ok = Reply::Simple {
        handle: h,
        error: 0,
    };
    let check = |errno: u32, what: &str| -> Result<(), Fail> {
        let size = e.size();
        if in_range(off, len, size) {
            Ok(())
        } else {
            Err(Fail::new(
                errno,
                format!("{what} of {len} bytes at offset {off} is beyond the export size {size}"),
            ))
        }
    };
    let writable = |what: &str| -> Result<(), Fail> {
        if e.read_only() {
            Err(Fail::new(EPERM, format!("{what} on a read-only export")))
        } else {
            Ok(())
        }
    };
    match req.command {
        Command::Read => {
            check(EINVAL, "read")?;
            if len == 0 {
                return Ok(if s.structured {
                    Reply::Done { handle: h }
                } else {
                    ok
                });
            }
            let chunks = e.read(off, len).map_err(|x| Fail::export(x, off, len))?;
            read_reply(s, req, chunks)
        }
        Command::Write => {
            writable("write")?;
            check(ENOSPC, "write")?;
            if len > 0 {
                e.write(off, &payload, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
                ServerStats::add(&stats().bytes_written, len);
            }
            Ok(ok)
        }
        Command::Flush => {
            e.flush().map_err(|x| Fail::export(x, 0, 0))?;
            Ok(ok)
        }
        Command::Trim => {
            writable("trim")?;
            check(EINVAL, "trim")?;
            if len > 0 {
                e.trim(off, len, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
            }
            Ok(ok)
        }
        Command::WriteZeroes => {
            writable("write zeroes")?;
            check(ENOSPC, "write zeroes")?;
            // NBD_CMD_FLAG_FAST_ZERO: zeroing is never slower than writing
            // here, so it is simply carried out.
            let allocate = req.flags & CMD_FLAG_NO_HOLE != 0;
            if len > 0 {
                e.write_zeroes(off, len, allocate, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
            }
            Ok(ok)
        }
        Command::Cache => {
            check(EINVAL, "cache")?;
            Ok(ok)
        }
        Command::BlockStatus => {
            if s.contexts.is_empty() {
                return Err(Fail::new(EINVAL, "no metadata context was negotiated"));
            }
            if len == 0 {
                return Err(Fail::new(EINVAL, "block status of 0 bytes"));
            }
            check(EINVAL, "block status")?;
            let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
            let mut payloads = Vec::with_capacity(s.contexts.len());
            for (id, name) in &s.contexts {
                let ext = e
                    .block_status(name, off, len)
                    .map_err(|x| Fail::export(x, off, len))?;
                payloads.push(encode_extents(*id, &ext, req.len, req_one));
            }
            Ok(Reply::BlockStatus {
                handle: h,
                payloads,
            })
        }
        Command::Disc | Command::Unknown(_) => Err(Fail::new(EINVAL, "unexpected command")),
    }
}

/// Checks that the export's chunks cover exactly `len` bytes; drops empty ones.
fn normalize_read(chunks: Vec<ReadChunk>, len: u64) -> Result<Vec<ReadChunk>, String> {
    if chunks
        .iter()
        .any(|c| matches!(c, ReadChunk::Shared(..)) && c.data().is_none())
    {
        return Err("export returned a range outside its buffer".into());
    }
    let total: u64 = chunks
        .iter()
        .map(ReadChunk::len)
        .fold(0u64, |a, b| a.saturating_add(b));
    if total != len {
        return Err(format!("export returned {total} bytes for a read of {len}"));
    }
    Ok(chunks.into_iter().filter(|c| !c.is_empty()).collect())
}

/// Encodes one `NBD_REPLY_TYPE_BLOCK_STATUS` payload: the export's extents
/// clipped to the request, zero-length ones dropped, equal neighbours
/// merged, long ones split to fit `u32`, at most [`MAX_EXTENTS`] (one with
/// `req_one`). An empty answer becomes one extent of status 0 (always safe).
pub(crate) fn encode_extents(
    id: u32,
    extents: &[StatusExtent],
    len: u32,
    req_one: bool,
) -> Vec<u8> {
    let mut merged: Vec<(u64, u32)> = Vec::new();
    let mut left = u64::from(len);
    for x in extents {
        if left == 0 {
            break;
        }
        let l = x.len.min(left);
        if l == 0 {
            continue;
        }
        match merged.last_mut() {
            Some(last) if last.1 == x.flags => last.0 += l,
            _ => merged.push((l, x.flags)),
        }
        left -= l;
    }
    if merged.is_empty() {
        merged.push((u64::from(len), 0));
    }
    let max = if req_one { 1 } else { MAX_EXTENTS };
    let mut out = Vec::with_capacity(4 + 8 * merged.len().min(max));
    out.extend_from_slice(&id.to_be_bytes());
    let mut count = 0;
    'outer: for (mut l, flags) in merged {
        while l > 0 {
            if count == max {
                break 'outer;
            }
            let piece = l.min(MAX_EXTENT_LEN);
            out.extend_from_slice(&(piece as u32).to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
            l -= piece;
            count += 1;
        }
    }
    out
}

/// Logs the end of a session (warn for protocol violations).
pub(crate) fn log_end(peer: std::net::SocketAddr, export: &str, end: &End, log: &BadClients) {
    match end {
        End::Protocol(m) => {
            ServerStats::add(&stats().protocol_errors, 1);
            log.report(
                "protocol error",
                Some(peer),
                &format_args!("export {export}: {m}; connection closed"),
            );
        }
        End::Io(e) => debug!(%peer, export, "connection ended: {e}"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(p: &[u8]) -> (u32, Vec<(u32, u32)>) {
        let id = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        let d = p[4..]
            .chunks(8)
            .map(|c| {
                (
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        (id, d)
    }

    #[test]
    fn extents_clip_merge_split() {
        let x = |len, flags| StatusExtent { len, flags };
        // merge equal neighbours, drop empties, clip to the request
        let p = encode_extents(
            3,
            &[x(512, 0), x(0, 1), x(512, 0), x(4096, 3), x(1 << 40, 0)],
            2048,
            false,
        );
        assert_eq!(decode(&p), (3, vec![(1024, 0), (1024, 3)]));
        // REQ_ONE: one extent, within the request
        let p = encode_extents(1, &[x(512, 0), x(512, 3)], 4096, true);
        assert_eq!(decode(&p), (1, vec![(512, 0)]));
        // empty answer -> one extent of status 0
        let p = encode_extents(1, &[], 100, false);
        assert_eq!(decode(&p), (1, vec![(100, 0)]));
        // an extent over u32 is split
        let p = encode_extents(1, &[x(u64::MAX, 3)], u32::MAX, false);
        let (_, d) = decode(&p);
        assert_eq!(
            d.iter().map(|e| u64::from(e.0)).sum::<u64>(),
            u64::from(u32::MAX)
        );
        assert!(d
            .iter()
            .all(|e| e.1 == 3 && u64::from(e.0) <= MAX_EXTENT_LEN));
    }

    #[test]
    fn read_normalization() {
        assert!(normalize_read(vec![ReadChunk::Data(vec![1; 10])], 11).is_err());
        let v = normalize_read(
            vec![
                ReadChunk::Data(vec![]),
                ReadChunk::Hole(5),
                ReadChunk::Hole(0),
            ],
            5,
        )
        .unwrap();
        assert_eq!(v, vec![ReadChunk::Hole(5)]);
        assert!(normalize_read(vec![ReadChunk::Hole(u64::MAX), ReadChunk::Hole(2)], 1).is_err());
        // A shared range outside its buffer is an error, not a panic.
        let buf = Arc::new(vec![0u8; 8]);
        assert!(normalize_read(vec![ReadChunk::Shared(buf.clone(), 4..12)], 8).is_err());
        let v = normalize_read(
            vec![
                ReadChunk::Shared(buf.clone(), 2..2),
                ReadChunk::Shared(buf, 0..8),
            ],
            8,
        )
        .unwrap();
        assert_eq!(v.len(), 1);
    }
}

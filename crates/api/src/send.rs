//! `POST /v1/send`, `POST|DELETE /v1/receive`: send streams over HTTP,
//! streamed both ways (never held in memory): the engine's blocking send
//! writes into a bounded channel the response body drains; the request
//! body of a receive is pumped into a bounded channel the engine reads.

use crate::server::{ApiError, ApiState, Json, Q};
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use dataset::{ReceiveOptions, SendOptions};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Bytes per chunk between the engine and the connection (the stream
/// writer fills each to about this, see `stream::Writer`).
const CHUNK: usize = 1 << 20;
/// Chunks in flight each way: bounds a transfer's memory to ~8 MiB.
const DEPTH: usize = 8;

/// A peer that takes or gives no stream bytes for this long is given up on
/// (the send ends, the receive fails and keeps its resume state), so a
/// stalled connection never pins a transfer forever. 60 s;
/// `CISTERN_STREAM_STALL_SECS` changes it (tests use a few seconds).
pub fn stream_stall() -> std::time::Duration {
    let secs = std::env::var("CISTERN_STREAM_STALL_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(60.0);
    std::time::Duration::from_secs_f64(secs)
}

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/send", post(send))
        .route("/v1/send/local", axum::routing::get(send_local))
        .route(
            "/v1/receive",
            post(receive).delete(receive_abort).get(receive_wait),
        )
        .route(
            "/v1/bookmarks",
            axum::routing::get(bookmarks).post(bookmark),
        )
}

/// `POST /v1/bookmarks`: `cistern bookmark SNAP BOOKMARK`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookmarkRequest {
    pub snapshot: String,
    pub bookmark: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BookmarksQuery {
    root: Option<String>,
}

async fn bookmark(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Json(req): Json<BookmarkRequest>,
) -> Result<Response, ApiError> {
    let engine = st.engine.clone();
    tokio::task::spawn_blocking(move || engine.bookmark(&req.snapshot, &req.bookmark))
        .await
        .map_err(|e| ApiError::from(dataset::Error::Io(e.to_string())))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn bookmarks(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Q(q): Q<BookmarksQuery>,
) -> Result<Response, ApiError> {
    let engine = st.engine.clone();
    let list = tokio::task::spawn_blocking(move || engine.bookmarks(q.root.as_deref()))
        .await
        .map_err(|e| ApiError::from(dataset::Error::Io(e.to_string())))??;
    Ok(axum::Json(list).into_response())
}

/// `GET /v1/send/local`: the socket local CLIs hand their stream to
/// (crate::send_local); 404 when this daemon has none.
async fn send_local() -> Result<Response, ApiError> {
    match crate::send_local::info() {
        Some(info) => Ok(axum::Json(info).into_response()),
        None => Err(ApiError::from(dataset::Error::NotFound(
            "no local stream socket".into(),
        ))),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendQuery {
    dry_run: Option<String>,
}

/// `send -n`: the estimated stream size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendEstimate {
    pub bytes: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ReceiveQuery {
    target: String,
    force: Option<String>,
    resumable: Option<String>,
}

fn flag(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("1" | "true" | "yes" | ""))
}

enum Msg {
    Data(Bytes),
    Fail(dataset::Error),
}

/// Chunk buffers the connection has written come back here for reuse:
/// a fresh 1 MiB buffer per chunk is mapped anew (glibc maps blocks of
/// 1 MiB and more, see `serve::tune_malloc`), and its page faults and
/// zeroing cost about as much as the copy into it.
type ChunkPool = std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// A chunk on its way to the connection; its buffer goes back to the pool.
struct PooledChunk {
    buf: Vec<u8>,
    pool: ChunkPool,
}

impl AsRef<[u8]> for PooledChunk {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for PooledChunk {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if let Ok(mut pool) = self.pool.lock() {
            // At most what can be in flight, plus the one being filled.
            if pool.len() <= DEPTH + 2 {
                pool.push(buf);
            }
        }
    }
}

/// Hands the stream writer's buffers to the response body as they are
/// (no copy) and gives it emptied ones back.
struct ChannelWriter {
    tx: mpsc::Sender<Msg>,
    pool: ChunkPool,
    rt: tokio::runtime::Handle,
    stall: std::time::Duration,
}

impl ChannelWriter {
    fn new(tx: mpsc::Sender<Msg>, rt: tokio::runtime::Handle) -> ChannelWriter {
        ChannelWriter {
            tx,
            pool: Default::default(),
            rt,
            stall: stream_stall(),
        }
    }
}

impl dataset::send::stream::ChunkSink for ChannelWriter {
    fn put(&mut self, buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
        if !buf.is_empty() {
            let chunk = Bytes::from_owner(PooledChunk {
                buf,
                pool: self.pool.clone(),
            });
            // A client that stops reading (a stalled connection) ends the send.
            let sent = self
                .rt
                .block_on(self.tx.send_timeout(Msg::Data(chunk), self.stall));
            sent.map_err(|e| match e {
                mpsc::error::SendTimeoutError::Timeout(_) => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the client read nothing for {} s", self.stall.as_secs_f64()),
                ),
                mpsc::error::SendTimeoutError::Closed(_) => {
                    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
                }
            })?;
        }
        let reused = self.pool.lock().ok().and_then(|mut p| p.pop());
        Ok(reused.unwrap_or_else(|| Vec::with_capacity(CHUNK)))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn send(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Q(q): Q<SendQuery>,
    Json(opts): Json<SendOptions>,
) -> Result<Response, ApiError> {
    let engine = st.engine.clone();
    if flag(&q.dry_run) {
        let bytes = tokio::task::spawn_blocking(move || engine.send_estimate(&opts))
            .await
            .map_err(|e| ApiError::from(dataset::Error::Io(e.to_string())))??;
        return Ok(axum::Json(SendEstimate { bytes }).into_response());
    }
    tracing::info!(snapshot = %opts.snapshot, from = ?opts.from, "send");
    let (tx, mut rx) = mpsc::channel::<Msg>(DEPTH);
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter::new(tx.clone(), rt);
        match engine.send_chunks(&opts, &mut w) {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(snapshot = %opts.snapshot, "send failed: {e}");
                let _ = tx.blocking_send(Msg::Fail(e));
            }
        }
    });
    // An error before the first byte is an HTTP error; after it, the body
    // ends early and the receiver finds the stream truncated.
    let first = match rx.recv().await {
        Some(Msg::Data(b)) => b,
        Some(Msg::Fail(e)) => return Err(e.into()),
        None => return Err(dataset::Error::Io("send ended without a stream".into()).into()),
    };
    let rest = futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Some(Msg::Data(b)) => Some((Ok::<Bytes, std::io::Error>(b), rx)),
            Some(Msg::Fail(e)) => Some((Err(std::io::Error::other(e.to_string())), rx)),
            None => None,
        }
    });
    let body = futures::stream::once(async move { Ok(first) }).chain(rest);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(body),
    )
        .into_response())
}

/// A `Read` over the batches the request body pump delivers.
struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    cur: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => {
                    let kind = if e.starts_with("connection stalled") {
                        std::io::ErrorKind::TimedOut
                    } else {
                        std::io::ErrorKind::UnexpectedEof
                    };
                    return Err(std::io::Error::new(kind, e));
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

/// Request body bytes go to the receive thread in batches: one wake-up of
/// that thread per batch, not one per body frame (a few KiB each), which
/// cost more CPU than the receive itself. A batch is what the connection
/// has ready, up to this much: never waited for, so no byte is held back,
/// and the body is read no further ahead than before (what sits in the
/// pipeline when the connection breaks is sent again by the resumed
/// transfer). 1 MiB (was 256 KiB: receiver 1.93 -> 1.69 CPU s/GiB over
/// HTTP); a retry waits for the cut receive to apply its last batch before
/// it reads the resume token (`receive_wait`), so a bigger batch only
/// moves the token further, never behind what lands.
const BATCH: usize = 1 << 20;
/// Batches queued for the receive thread.
const BATCH_DEPTH: usize = 1;

/// Gathers body frames into reused batch buffers. Frames are copied and
/// dropped at once, so hyper reuses its read buffer instead of allocating
/// fresh memory (page faults) for every read while frames are in flight.
struct Batcher {
    buf: Vec<u8>,
    pool: ChunkPool,
}

impl Batcher {
    fn push(&mut self, frame: &[u8]) {
        if self.buf.capacity() == 0 {
            let reused = self.pool.lock().ok().and_then(|mut p| p.pop());
            self.buf = reused.unwrap_or_else(|| Vec::with_capacity(2 * BATCH));
        }
        self.buf.extend_from_slice(frame);
    }

    /// The batch so far, as a chunk whose buffer comes back to the pool.
    fn take(&mut self) -> Option<Bytes> {
        if self.buf.is_empty() {
            return None;
        }
        Some(Bytes::from_owner(PooledChunk {
            buf: std::mem::take(&mut self.buf),
            pool: self.pool.clone(),
        }))
    }
}

/// Pumps the request body into `tx` in batches until it ends, fails or
/// stalls; goes on reading (and dropping) after the receiver went away,
/// so the client reads our answer instead of a broken pipe.
async fn pump_body(
    body: Body,
    tx: mpsc::Sender<Result<Bytes, String>>,
    stall: std::time::Duration,
) {
    let mut data = body.into_data_stream();
    let mut batch = Batcher {
        buf: Vec::new(),
        pool: Default::default(),
    };
    let mut open = true;
    let mut last = tokio::time::Instant::now();
    let lost = |r: Result<Bytes, axum::Error>| r.map_err(|e| format!("connection lost: {e}"));
    loop {
        // A sender that stops sending fails the receive (which keeps
        // its resume state) instead of holding the target forever.
        let wait = stall.saturating_sub(last.elapsed());
        let mut next = match tokio::time::timeout(wait, data.next()).await {
            Ok(next) => next.map(lost),
            Err(_) if last.elapsed() < stall => continue,
            Err(_) => Some(Err(format!(
                "connection stalled: no stream bytes for {} s",
                stall.as_secs_f64()
            ))),
        };
        // Then what else is ready now, up to a batch.
        let end = loop {
            match next {
                Some(Ok(frame)) => {
                    last = tokio::time::Instant::now();
                    if open {
                        batch.push(&frame);
                    }
                }
                Some(Err(why)) => break Some(Err(why)),
                None => break Some(Ok(())),
            }
            if batch.buf.len() >= BATCH {
                break None;
            }
            // (Polled in the task's own context, not with a no-op waker:
            // that cost twice the context switches of per-frame delivery.)
            match tokio::time::timeout(std::time::Duration::ZERO, data.next()).await {
                Ok(n) => next = n.map(lost),
                Err(_) => break None,
            }
        };
        if let Some(chunk) = batch.take() {
            if open && tx.send(Ok(chunk)).await.is_err() {
                open = false;
            }
        }
        match end {
            None => {}
            Some(Ok(())) => break,
            Some(Err(why)) => {
                if open {
                    let _ = tx.send(Err(why)).await;
                }
                break;
            }
        }
    }
}

async fn receive(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Q(q): Q<ReceiveQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    if q.target.is_empty() {
        return Err(ApiError::bad_request("name the target dataset (?target=)"));
    }
    let opts = ReceiveOptions {
        target: q.target.clone(),
        force: flag(&q.force),
        resumable: flag(&q.resumable),
    };
    tracing::info!(target = %opts.target, force = opts.force, resumable = opts.resumable, "receive");
    let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(BATCH_DEPTH);
    // Reads the whole body even after the engine stopped (a refused
    // stream): the client then reads our answer instead of a broken pipe.
    let pump = tokio::spawn(pump_body(body, tx, stream_stall()));
    let engine = st.engine.clone();
    let done = tokio::task::spawn_blocking(move || {
        let mut r = ChannelReader {
            rx,
            cur: Bytes::new(),
        };
        engine.receive(&opts, &mut r)
    })
    .await;
    let _ = pump.await;
    match done {
        Ok(Ok(sum)) => Ok(axum::Json(sum).into_response()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(dataset::Error::Io(format!("receive failed: {e}")).into()),
    }
}

async fn receive_abort(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Q(q): Q<ReceiveQuery>,
) -> Result<Response, ApiError> {
    let engine = st.engine.clone();
    tracing::info!(target = %q.target, "receive -A");
    tokio::task::spawn_blocking(move || engine.receive_abort(&q.target))
        .await
        .map_err(|e| ApiError::from(dataset::Error::Io(e.to_string())))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WaitQuery {
    target: String,
    wait_ms: Option<u64>,
}

/// A wait is bounded here too, whatever the client asks.
const MAX_RECEIVE_WAIT_MS: u64 = 60_000;

/// `GET /v1/receive?target=DS&wait_ms=N`: 204 once no receive into DS runs
/// (waiting up to N ms for a running one to end), else Busy (409). A retry
/// asks this before it reads the target's `receive_resume_token`.
async fn receive_wait(
    axum::extract::State(st): axum::extract::State<ApiState>,
    Q(q): Q<WaitQuery>,
) -> Result<Response, ApiError> {
    if q.target.is_empty() {
        return Err(ApiError::bad_request("name the target dataset (?target=)"));
    }
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(MAX_RECEIVE_WAIT_MS));
    let engine = st.engine.clone();
    tokio::task::spawn_blocking(move || engine.receive_wait(&q.target, wait))
        .await
        .map_err(|e| ApiError::from(dataset::Error::Io(e.to_string())))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

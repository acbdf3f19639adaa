//! An `ObjectStore` wrapper that injects the failures a real store shows
//! now and then and a test cannot otherwise cause on demand: a PUT that
//! fails, a PUT that happens but whose answer is lost, a slow PUT. It also
//! counts PUTs, so group commit can be checked. Used by tests only; it is
//! here, not under `tests/`, so the daemon's fault tests can use it too.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the next PUTs do, in order; once the script is empty they pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutFault {
    /// Refused before reaching the store.
    Fail,
    /// Stored, but the caller gets an error (the answer was lost).
    LoseAnswer,
    /// Stored after a delay.
    Slow(Duration),
}

#[derive(Debug, Default)]
pub struct Faults {
    script: Mutex<VecDeque<PutFault>>,
    puts: AtomicU64,
    /// A simulated kill -9: after this many more PUTs and DELETEs, every
    /// later one fails without reaching the store (decision 0049's tests).
    crash: Mutex<Option<u64>>,
    crashed: std::sync::atomic::AtomicBool,
    /// GETs whose path contains the filter fail while the count lasts (a
    /// partitioned reader, a GET that fails once during a replay).
    get_faults: Mutex<Option<(String, u64)>>,
    /// GETs of segment objects to answer with one byte flipped (decision
    /// 0054's tests).
    get_corrupt: AtomicU64,
    /// A paused owner (SIGSTOP): the Nth next PUT/DELETE waits before it
    /// reaches the store until [`Faults::resume`].
    pause_at: Mutex<Option<u64>>,
    paused: std::sync::atomic::AtomicBool,
    resumed: tokio::sync::Notify,
    /// Every PUT/DELETE in order ("PUT path", "DELETE path").
    calls: Mutex<Vec<String>>,
}

/// Longest a paused call waits for [`Faults::resume`] (a test bound).
const PAUSE_MAX: Duration = Duration::from_secs(60);

impl Faults {
    pub fn push(&self, f: PutFault) {
        self.script.lock().push_back(f);
    }

    /// Lets `n` more PUTs/DELETEs through, then fails every later one.
    pub fn crash_after(&self, n: u64) {
        *self.crash.lock() = Some(n);
    }

    /// Fails the next `n` GETs whose path contains `filter` (`u64::MAX`:
    /// until [`Faults::heal_gets`]).
    pub fn fail_gets(&self, filter: &str, n: u64) {
        *self.get_faults.lock() = Some((filter.to_string(), n));
    }

    pub fn heal_gets(&self) {
        *self.get_faults.lock() = None;
    }

    /// Whether this GET fails (and counts it).
    fn get_fails(&self, location: &Path) -> bool {
        let mut g = self.get_faults.lock();
        match g.as_mut() {
            Some((filter, n)) if *n > 0 && location.as_ref().contains(filter.as_str()) => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// Whether the simulated crash point was reached.
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Counts one mutating call; false once the crash point is passed.
    fn survives(&self) -> bool {
        let mut c = self.crash.lock();
        match c.as_mut() {
            None => true,
            Some(0) => {
                self.crashed.store(true, Ordering::SeqCst);
                false
            }
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }

    /// The next `n` segment GETs fail (0: none).
    pub fn fail_segment_gets(&self, n: u64) {
        self.fail_gets(SEGMENTS, n);
    }

    /// The next `n` segment GETs answer with one byte changed.
    pub fn corrupt_segment_gets(&self, n: u64) {
        self.get_corrupt.store(n, Ordering::SeqCst);
    }

    fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// The call `n` PUTs/DELETEs from now (0: the next one; the heartbeat
    /// object's are not counted) stops before it
    /// reaches the store, as if its process were stopped, until
    /// [`Faults::resume`]; [`Faults::paused`] tells when it is held.
    pub fn pause_after(&self, n: u64) {
        *self.pause_at.lock() = Some(n);
    }

    /// Whether a call is held by [`Faults::pause_after`].
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Lets the held call go on.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        self.resumed.notify_waiters();
    }

    /// The PUTs and DELETEs so far, in order: "PUT path" or "DELETE path".
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    /// Records this PUT/DELETE and holds it if it is the one to pause.
    /// The heartbeat object is not counted: its own thread writes it at its
    /// own pace, so counting it would make the paused call a matter of timing.
    async fn maybe_pause(&self, call: String) {
        let beat = call.ends_with("heartbeat");
        self.calls.lock().push(call);
        if beat {
            return;
        }
        let hit = {
            let mut p = self.pause_at.lock();
            match p.as_mut() {
                Some(0) => {
                    *p = None;
                    true
                }
                Some(n) => {
                    *n -= 1;
                    false
                }
                None => false,
            }
        };
        if !hit {
            return;
        }
        self.paused.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(PAUSE_MAX, async {
            loop {
                // Registered before the check: a resume in between wakes it.
                let woken = self.resumed.notified();
                if !self.paused() {
                    break;
                }
                woken.await;
            }
        })
        .await;
    }

    /// PUTs that reached the store.
    pub fn puts(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }
}

/// What every segment object's key holds.
const SEGMENTS: &str = "/seg/";

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    pub faults: Arc<Faults>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore {
            inner,
            faults: Arc::new(Faults::default()),
        }
    }
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected fault: {what}").into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.faults.maybe_pause(format!("PUT {location}")).await;
        if !self.faults.survives() {
            return Err(injected("crashed"));
        }
        let fault = self.faults.script.lock().pop_front();
        match fault {
            Some(PutFault::Fail) => Err(injected("PUT failed")),
            Some(PutFault::LoseAnswer) => {
                self.faults.puts.fetch_add(1, Ordering::SeqCst);
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected("PUT answer lost"))
            }
            Some(PutFault::Slow(d)) => {
                tokio::time::sleep(d).await;
                self.faults.puts.fetch_add(1, Ordering::SeqCst);
                self.inner.put_opts(location, payload, opts).await
            }
            None => {
                self.faults.puts.fetch_add(1, Ordering::SeqCst);
                self.inner.put_opts(location, payload, opts).await
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if self.faults.get_fails(location) {
            return Err(injected("GET failed"));
        }
        let r = self.inner.get_opts(location, options).await?;
        if !(location.as_ref().contains(SEGMENTS) && Faults::take(&self.faults.get_corrupt)) {
            return Ok(r);
        }
        let (meta, range, attributes) = (r.meta.clone(), r.range.clone(), r.attributes.clone());
        let mut body = r.bytes().await?.to_vec();
        let mid = body.len() / 2;
        if let Some(b) = body.get_mut(mid) {
            *b ^= 0x40;
        }
        let body = bytes::Bytes::from(body);
        Ok(GetResult {
            payload: object_store::GetResultPayload::Stream(Box::pin(futures::stream::once(
                async move { Ok(body) },
            ))),
            meta,
            range,
            attributes,
        })
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.faults.maybe_pause(format!("DELETE {location}")).await;
        if !self.faults.survives() {
            return Err(injected("crashed"));
        }
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

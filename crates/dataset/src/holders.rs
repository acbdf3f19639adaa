//! Which datasets front ends have open, so that destroy, rollback and pool
//! export/destroy can refuse ("dataset is busy") or, forced, take them away
//! first. Front-end neutral: an NBD connection, an S3 or NFS session
//! registers the same way, with a description for messages and a revoke
//! callback.
//!
//! It also tells the snapshot scheduler when a backup finished: a handle
//! opened for an event kind ([`OpenHandle::snapshot_on_close`]) and marked
//! as written ([`WriteMark`]) leaves the dataset "written" when it closes;
//! when the dataset's last handle closes, the dataset is queued for
//! `crate::autosnap` (never a snapshot inside `Drop`). Handles taken away
//! by a forced destroy/rollback/export queue nothing.

use crate::*;
use parking_lot::Mutex;
use policy::EventKind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Called with the reason when a forced operation takes the dataset away.
/// When it returns, the holder no longer touches the dataset (it waited for
/// its requests in progress and refuses new ones).
pub type Revoke = Arc<dyn Fn(&str) + Send + Sync>;

/// When a rollback of a held dataset happens around a holder that can
/// follow it (a FUSE mount: ZFS rolls back mounted filesystems too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackPhase {
    /// Before: write back what the holder caches (dirty pages).
    Before,
    /// After (also after a failed rollback): drop every cached view of the
    /// dataset, so nothing from before the rollback is served again.
    After,
}

/// A holder that follows rollbacks instead of blocking them.
pub type FollowRollback = Arc<dyn Fn(RollbackPhase) + Send + Sync>;

/// What a busy check covers.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    /// These datasets or snapshots, by name.
    Names(Vec<String>),
    /// A dataset, every dataset below it and all their snapshots.
    Tree(String),
    /// Everything.
    All,
}

impl Scope {
    fn covers(&self, name: &str) -> bool {
        match self {
            Scope::Names(v) => v.iter().any(|n| n == name),
            Scope::All => true,
            Scope::Tree(root) => {
                name == root
                    || name
                        .strip_prefix(root.as_str())
                        .is_some_and(|rest| rest.starts_with('/') || rest.starts_with('@'))
            }
        }
    }
}

struct Holder {
    dataset: String,
    client: String,
    revoke: Revoke,
    /// The event a close after writing reports (`None`: none).
    event: Option<EventKind>,
    wrote: Arc<AtomicBool>,
    follow: Option<FollowRollback>,
}

#[derive(Default)]
struct State {
    next: u64,
    open: BTreeMap<u64, Holder>,
    /// Operations in progress that no new holder may race with.
    fences: BTreeMap<u64, Scope>,
    /// Datasets a closed handle wrote to while others stay open.
    written: BTreeMap<String, EventKind>,
    /// Datasets whose last handle closed after writes, for the scheduler.
    finished: BTreeMap<String, EventKind>,
}

#[derive(Default)]
pub(crate) struct Holders {
    st: Mutex<State>,
}

/// A front end's hold on one dataset; released when dropped.
pub struct OpenHandle {
    holders: std::sync::Weak<Holders>,
    id: u64,
    wrote: Arc<AtomicBool>,
}

/// Marks a handle as having written: cheap (one relaxed load after the
/// first), for the front end's write path.
#[derive(Clone)]
pub struct WriteMark(Arc<AtomicBool>);

impl WriteMark {
    pub fn mark(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

impl OpenHandle {
    /// When this handle has written ([`OpenHandle::write_mark`]) and is the
    /// dataset's last to close, the snapshot scheduler gets `event`
    /// (policies opt in with `events = [...]`).
    pub fn snapshot_on_close(&self, event: EventKind) {
        if let Some(h) = self.holders.upgrade() {
            if let Some(holder) = h.st.lock().open.get_mut(&self.id) {
                holder.event = Some(event);
            }
        }
    }

    /// What the front end marks on every successful write, trim or zeroing.
    pub fn write_mark(&self) -> WriteMark {
        WriteMark(self.wrote.clone())
    }
}

impl Drop for OpenHandle {
    fn drop(&mut self) {
        if let Some(h) = self.holders.upgrade() {
            let mut st = h.st.lock();
            let Some(gone) = st.open.remove(&self.id) else {
                return; // revoked: the dataset was taken away, no event
            };
            if let Some(event) = gone.event.filter(|_| gone.wrote.load(Ordering::Relaxed)) {
                st.written.insert(gone.dataset.clone(), event);
            }
            let last = !st.open.values().any(|o| o.dataset == gone.dataset);
            if last {
                if let Some(event) = st.written.remove(&gone.dataset) {
                    st.finished.insert(gone.dataset, event);
                }
            }
        }
    }
}

/// Keeps new holders out of a scope while an operation on it runs.
pub(crate) struct Fence {
    holders: Arc<Holders>,
    id: u64,
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.holders.st.lock().fences.remove(&self.id);
    }
}

/// Who holds a dataset open, for `holders` listings and busy messages.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HolderInfo {
    pub dataset: String,
    pub client: String,
}

impl Holders {
    pub(crate) fn open(
        self: &Arc<Self>,
        dataset: &str,
        client: String,
        revoke: Revoke,
        follow: Option<FollowRollback>,
    ) -> Result<OpenHandle> {
        let mut st = self.st.lock();
        if st.fences.values().any(|f| f.covers(dataset)) {
            return Err(Error::Busy(format!(
                "'{dataset}' is being destroyed, rolled back or exported"
            )));
        }
        st.next += 1;
        let id = st.next;
        let wrote = Arc::new(AtomicBool::new(false));
        st.open.insert(
            id,
            Holder {
                dataset: dataset.to_string(),
                client,
                revoke,
                event: None,
                wrote: wrote.clone(),
                follow,
            },
        );
        Ok(OpenHandle {
            holders: Arc::downgrade(self),
            id,
            wrote,
        })
    }

    /// Datasets whose last handle closed after writes since the last call,
    /// with the event that reports it.
    pub(crate) fn take_finished(&self) -> BTreeMap<String, EventKind> {
        std::mem::take(&mut self.st.lock().finished)
    }

    /// Renamed datasets and snapshots: `(old name, new name)` pairs.
    pub(crate) fn rename(&self, moves: &[(String, String)]) {
        let mut st = self.st.lock();
        for h in st.open.values_mut() {
            if let Some((_, new)) = moves.iter().find(|(old, _)| *old == h.dataset) {
                h.dataset = new.clone();
            }
        }
        for (old, new) in moves {
            if let Some(e) = st.written.remove(old) {
                st.written.insert(new.clone(), e);
            }
        }
    }

    /// The rollback followers among the holders of `dataset`.
    pub(crate) fn followers(&self, dataset: &str) -> Vec<FollowRollback> {
        self.st
            .lock()
            .open
            .values()
            .filter(|h| h.dataset == dataset)
            .filter_map(|h| h.follow.clone())
            .collect()
    }

    pub(crate) fn list(&self, scope: &Scope) -> Vec<HolderInfo> {
        self.st
            .lock()
            .open
            .values()
            .filter(|h| scope.covers(&h.dataset))
            .map(|h| HolderInfo {
                dataset: h.dataset.clone(),
                client: h.client.clone(),
            })
            .collect()
    }

    /// Fences `scope` for the caller's operation. With holders in it:
    /// without `force` the operation is refused with `busy(holders)`; with
    /// `force` each is revoked (told `reason`, waited for) and dropped.
    /// `skip_followers`: holders that follow rollbacks neither block nor are revoked.
    pub(crate) fn fence(
        self: &Arc<Self>,
        scope: Scope,
        force: bool,
        reason: &str,
        busy: impl FnOnce(&str) -> String,
        skip_followers: bool,
    ) -> Result<Fence> {
        let (id, revoked) = {
            let mut st = self.st.lock();
            let ids: Vec<u64> = st
                .open
                .iter()
                .filter(|(_, h)| scope.covers(&h.dataset))
                .filter(|(_, h)| !(skip_followers && h.follow.is_some()))
                .map(|(id, _)| *id)
                .collect();
            if !ids.is_empty() && !force {
                let mut who: Vec<String> = ids
                    .iter()
                    .take(3)
                    .map(|id| st.open[id].client.clone())
                    .collect();
                if ids.len() > who.len() {
                    who.push(format!("{} more", ids.len() - who.len()));
                }
                return Err(Error::Busy(busy(&who.join(", "))));
            }
            st.next += 1;
            let id = st.next;
            let revoked: Vec<Holder> = ids.iter().filter_map(|id| st.open.remove(id)).collect();
            // What they wrote is being destroyed or rolled back: no event.
            st.written.retain(|d, _| !scope.covers(d));
            st.finished.retain(|d, _| !scope.covers(d));
            st.fences.insert(id, scope);
            (id, revoked)
        };
        let fence = Fence {
            holders: self.clone(),
            id,
        };
        // Outside the lock: a revoke waits for the holder's requests in
        // progress, and their handles' drops take the lock.
        for h in revoked {
            tracing::info!(dataset = %h.dataset, client = %h.client, "{reason}: disconnecting");
            (h.revoke)(reason);
        }
        Ok(fence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn scopes() {
        let t = Scope::Tree("tank/a".into());
        assert!(t.covers("tank/a"));
        assert!(t.covers("tank/a/b"));
        assert!(t.covers("tank/a@s"));
        assert!(!t.covers("tank/ab"));
        assert!(!t.covers("tank"));
        let n = Scope::Names(vec!["tank/a@s".into()]);
        assert!(n.covers("tank/a@s"));
        assert!(!n.covers("tank/a"));
    }

    #[test]
    fn busy_force_and_fence() {
        let h = Arc::new(Holders::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let handle = h
            .open(
                "tank/v",
                "nbd 127.0.0.1:1".into(),
                Arc::new(move |_| {
                    c.fetch_add(1, Ordering::SeqCst);
                }),
                None,
            )
            .unwrap();
        let scope = Scope::Tree("tank".into());
        let e = h
            .fence(
                scope.clone(),
                false,
                "x",
                |who| format!("busy: {who}"),
                false,
            )
            .err()
            .unwrap();
        assert!(e.to_string().contains("nbd 127.0.0.1:1"), "{e}");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Dropping the handle frees it.
        drop(handle);
        let f = h
            .fence(scope.clone(), false, "x", |w| w.into(), false)
            .unwrap();
        // Fenced: nobody gets in until the operation is over.
        assert!(h
            .open("tank/v", "c".into(), Arc::new(|_| {}), None)
            .is_err());
        drop(f);
        let _h2 = h
            .open(
                "tank/v",
                "c".into(),
                Arc::new({
                    let c = calls.clone();
                    move |_| {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                }),
                None,
            )
            .unwrap();
        let _f = h
            .fence(scope.clone(), true, "x", |w| w.into(), false)
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(h.list(&scope).is_empty());
    }

    #[test]
    fn the_last_close_after_writes_is_reported_once() {
        let h = Arc::new(Holders::default());
        let open = |ds: &str, event: bool| {
            let o = h.open(ds, "c".into(), Arc::new(|_| {}), None).unwrap();
            if event {
                o.snapshot_on_close(EventKind::NbdDisconnect);
            }
            o
        };
        // A writer closes while a reader stays: reported at the reader's close.
        let (writer, reader) = (open("tank/v", true), open("tank/v", true));
        writer.write_mark().mark();
        drop(writer);
        assert!(h.take_finished().is_empty());
        drop(reader);
        assert_eq!(
            h.take_finished(),
            BTreeMap::from([("tank/v".to_string(), EventKind::NbdDisconnect)])
        );
        assert!(h.take_finished().is_empty(), "reported twice");
        // Only readers: nothing.
        drop(open("tank/v", true));
        assert!(h.take_finished().is_empty());
        // A handle that did not ask for events: nothing.
        let quiet = open("tank/v", false);
        quiet.write_mark().mark();
        drop(quiet);
        assert!(h.take_finished().is_empty());
        // Renamed while open: reported under the new name.
        let w = open("tank/v", true);
        w.write_mark().mark();
        h.rename(&[("tank/v".into(), "tank/w".into())]);
        drop(w);
        assert!(h.take_finished().contains_key("tank/w"));
        // Taken away by a forced destroy or rollback: nothing.
        let w = open("tank/v", true);
        w.write_mark().mark();
        let f = h
            .fence(Scope::Tree("tank/v".into()), true, "x", |w| w.into(), false)
            .unwrap();
        drop(w);
        drop(f);
        assert!(h.take_finished().is_empty());
    }

    #[test]
    fn followers_do_not_block_a_rollback_fence() {
        let h = Arc::new(Holders::default());
        let _m = h
            .open(
                "tank/fs",
                "FUSE mount".into(),
                Arc::new(|_| panic!("a follower is not revoked")),
                Some(Arc::new(|_| {})),
            )
            .unwrap();
        assert_eq!(h.followers("tank/fs").len(), 1);
        assert!(h.followers("tank/other").is_empty());
        let scope = Scope::Names(vec!["tank/fs".into()]);
        // Destroy still sees it busy...
        assert!(h
            .fence(scope.clone(), false, "destroy", |w| w.into(), false)
            .is_err());
        // ...a rollback goes ahead.
        let _f = h
            .fence(scope, false, "rollback", |w| w.into(), true)
            .unwrap();
    }
}

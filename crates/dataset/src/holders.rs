//! Which datasets front ends have open, so that destroy, rollback and pool
//! export/destroy can refuse ("dataset is busy") or, forced, take them away
//! first. Front-end neutral: an NBD connection, an S3 or NFS session
//! registers the same way, with a description for messages and a revoke
//! callback.

use crate::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;

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
    follow: Option<FollowRollback>,
}

#[derive(Default)]
struct State {
    next: u64,
    open: BTreeMap<u64, Holder>,
    /// Operations in progress that no new holder may race with.
    fences: BTreeMap<u64, Scope>,
}

#[derive(Default)]
pub(crate) struct Holders {
    st: Mutex<State>,
}

/// A front end's hold on one dataset; released when dropped.
pub struct OpenHandle {
    holders: std::sync::Weak<Holders>,
    id: u64,
}

impl Drop for OpenHandle {
    fn drop(&mut self) {
        if let Some(h) = self.holders.upgrade() {
            h.st.lock().open.remove(&self.id);
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
        st.open.insert(
            id,
            Holder {
                dataset: dataset.to_string(),
                client,
                revoke,
                follow,
            },
        );
        Ok(OpenHandle {
            holders: Arc::downgrade(self),
            id,
        })
    }

    /// Renamed datasets and snapshots: `(old name, new name)` pairs.
    pub(crate) fn rename(&self, moves: &[(String, String)]) {
        for h in self.st.lock().open.values_mut() {
            if let Some((_, new)) = moves.iter().find(|(old, _)| *old == h.dataset) {
                h.dataset = new.clone();
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
            st.fences.insert(id, scope);
            let revoked: Vec<Holder> = ids.iter().filter_map(|id| st.open.remove(id)).collect();
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

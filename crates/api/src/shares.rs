//! File sharing front ends (SMB, later NFS) as the API sees them: one
//! trait, `cistern share`/`unshare`, and the "datasets changed"
//! notification that makes `cistern set sharesmb=on` take effect at once.
//!
//! The notification is a middleware, as the pool history is: after every
//! successful request that may change datasets or their properties (set,
//! inherit, create, destroy, rename, clone, promote, import, export...),
//! every [`ChangeHook`] runs before the answer is sent, so the share is
//! live when the CLI returns. A hook that finds nothing changed is cheap.

use crate::server::ApiState;
use crate::{ShareInfo, ShareList, ShareRequest};
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// Runs after datasets or properties may have changed (blocking is fine:
/// it runs on the blocking pool).
pub type ChangeHook = Arc<dyn Fn() + Send + Sync>;

/// A protocol that shares filesystem datasets at their mountpoints.
pub trait ShareService: Send + Sync {
    /// `smb` or `nfs`: `cistern share -a smb`, `ShareInfo::protocol`.
    fn protocol(&self) -> &'static str;
    /// Datasets or properties changed: re-read what is shared. Problems
    /// with single datasets are logged, not returned.
    fn refresh(&self) -> dataset::Result<()>;
    /// Shares every dataset (None) or one; returns what this protocol now
    /// shares of it (empty: its property is off for this protocol).
    fn share(&self, dataset: Option<&str>) -> dataset::Result<Vec<ShareInfo>>;
    /// Takes shares down until `share` or a restart; returns those removed.
    fn unshare(&self, dataset: Option<&str>) -> dataset::Result<Vec<ShareInfo>>;
    fn list(&self) -> ShareList;
}

/// Routes that cannot change datasets or properties: no refresh after them
/// (a refresh lists every dataset, and snapshots are taken by the thousand).
fn irrelevant(method: &Method, path: &str) -> bool {
    const NEVER: &[&str] = &[
        "/v1/users",
        "/v1/events",
        "/v1/labelclear",
        "/v1/shares",
        "/v1/holds",
        "/v1/snapshots",
        "/v1/rollback",
        "/v1/diff",
        "/v1/policy",
    ];
    if NEVER.iter().any(|p| path.starts_with(p)) {
        return true;
    }
    // Pools: only create, destroy and export change the datasets there are.
    match path.strip_prefix("/v1/pools/") {
        Some(rest) => {
            !(rest.ends_with("/export") || (method == Method::DELETE && !rest.contains('/')))
        }
        None => false,
    }
}

/// axum middleware: see the module comment.
pub async fn notify(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let mutating = matches!(
        req.method(),
        &Method::POST | &Method::PATCH | &Method::DELETE
    );
    let relevant = mutating && !irrelevant(req.method(), req.uri().path());
    let resp = next.run(req).await;
    if relevant && resp.status().is_success() && !st.change_hooks.is_empty() {
        let hooks = st.change_hooks.clone();
        let done = tokio::task::spawn_blocking(move || {
            for h in &hooks {
                h();
            }
        })
        .await;
        if let Err(e) = done {
            tracing::error!("a datasets-changed hook crashed: {e}");
        }
    }
    resp
}

/// The services a request names (`protocol`), or all of them.
fn services(st: &ApiState, protocol: Option<&str>) -> Result<Vec<Arc<dyn ShareService>>, String> {
    let all = st.share_services.clone();
    match protocol {
        None => Ok(all),
        Some(p) => {
            let some: Vec<_> = all.into_iter().filter(|s| s.protocol() == p).collect();
            if some.is_empty() {
                return Err(format!("no '{p}' sharing in this daemon"));
            }
            Ok(some)
        }
    }
}

/// `cistern share`: with a dataset, an error when no protocol shares it.
pub fn share(st: &ApiState, req: &ShareRequest) -> dataset::Result<ShareList> {
    let svcs = services(st, req.protocol.as_deref()).map_err(dataset::Error::InvalidArgument)?;
    let mut made = Vec::new();
    for s in &svcs {
        made.extend(s.share(req.dataset.as_deref())?);
    }
    if let Some(d) = &req.dataset {
        if made.is_empty() {
            let props: Vec<String> = svcs
                .iter()
                .map(|s| format!("'share{}'", s.protocol()))
                .collect();
            return Err(dataset::Error::InvalidArgument(if props.is_empty() {
                format!("cannot share '{d}': this daemon serves no file sharing protocol")
            } else {
                format!("cannot share '{d}': {} not set", props.join(" or "))
            }));
        }
        return Ok(ShareList {
            shares: made,
            problems: Vec::new(),
        });
    }
    Ok(list(st))
}

/// `cistern unshare`: with a dataset, an error when nothing shared it.
pub fn unshare(st: &ApiState, req: &ShareRequest) -> dataset::Result<ShareList> {
    let svcs = services(st, req.protocol.as_deref()).map_err(dataset::Error::InvalidArgument)?;
    let mut gone = Vec::new();
    for s in &svcs {
        gone.extend(s.unshare(req.dataset.as_deref())?);
    }
    if let Some(d) = &req.dataset {
        if gone.is_empty() {
            return Err(dataset::Error::InvalidArgument(format!(
                "cannot unshare '{d}': not currently shared"
            )));
        }
    }
    Ok(ShareList {
        shares: gone,
        problems: Vec::new(),
    })
}

pub fn list(st: &ApiState) -> ShareList {
    let mut out = ShareList::default();
    for s in &st.share_services {
        let l = s.list();
        out.shares.extend(l.shares);
        out.problems.extend(l.problems);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_after_dataset_changes_only() {
        let (post, patch, delete) = (Method::POST, Method::PATCH, Method::DELETE);
        for (m, p) in [
            (&patch, "/v1/dataset"),
            (&delete, "/v1/dataset"),
            (&post, "/v1/datasets"),
            (&post, "/v1/rename"),
            (&post, "/v1/inherit"),
            (&post, "/v1/clone"),
            (&post, "/v1/import"),
            (&post, "/v1/pools"),
            (&delete, "/v1/pools/tank"),
            (&post, "/v1/pools/tank/export"),
        ] {
            assert!(!irrelevant(m, p), "{m} {p}");
        }
        for (m, p) in [
            (&post, "/v1/snapshots"),
            (&post, "/v1/rollback"),
            (&post, "/v1/pools/tank/scrub"),
            (&post, "/v1/users"),
            (&post, "/v1/shares"),
        ] {
            assert!(irrelevant(m, p), "{m} {p}");
        }
    }
}

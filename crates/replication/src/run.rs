//! One run of a job, the same code for push and pull (only the [`Side`]s
//! differ):
//!
//! 1. an unfinished resumable receive on the target is continued from its
//!    `receive_resume_token`, not started over;
//! 2. the last common snapshot is the newest source snapshot the target
//!    also has; a target changed since it (snapshots made there, or bytes
//!    written) is refused, naming what changed, unless `--force`, which
//!    rolls it back;
//! 3. the snapshots since the common one go as one incremental stream with
//!    the ones between (`send -I`); a target with nothing gets a full
//!    stream of the oldest source snapshot first;
//! 4. the target is left `readonly=on`;
//! 5. the new common snapshot is held on both sides with the job's tag
//!    before the previous one is released, so pruning never breaks the chain;
//! 6. each side is pruned with its own policy's grid (`policy::plan`, the
//!    same planner as snapshot policies), the common snapshot always kept.

use crate::job::Job;
use crate::side::{Side, Snap, StreamSpec};
use crate::stream::{pipe, Progress};
use crate::{Error, Result};
use dataset::policy::{self, Input, Policies, SnapshotEntry};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What one run did (also what a failed run got done before failing).
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// `tank/vm@a` (full) or `tank/vm@a..@c` per stream received.
    pub streams: Vec<String>,
    pub bytes: u64,
    pub common: Option<String>,
    pub resumed: bool,
    pub up_to_date: bool,
    pub pruned_source: Vec<String>,
    pub pruned_target: Vec<String>,
    pub notes: Vec<String>,
}

pub struct Ctx<'a> {
    pub job: &'a Job,
    pub src: &'a dyn Side,
    pub dst: &'a dyn Side,
    pub policies: &'a Policies,
    pub progress: Arc<Progress>,
    /// Bytes over every run (metrics).
    pub total: Arc<AtomicU64>,
    pub force: bool,
    /// The common snapshot the previous run held.
    pub last_common: Option<String>,
    pub now: i64,
    /// A full stream of this job into the target was cut (its leftover, a
    /// target without snapshots, may be replaced without --force).
    pub partial_full: bool,
    /// Told (and persisted by the manager) before a full stream starts
    /// (true) and once it is in (false).
    pub mark_full: &'a (dyn Fn(bool) + Sync),
}

/// Streams `spec` from the source into the target through a bounded,
/// rate-limited pipe; the sender runs on its own thread.
fn transfer(ctx: &Ctx, spec: &StreamSpec, out: &mut Outcome) -> Result<()> {
    let before = ctx.progress.bytes.load(Ordering::Relaxed);
    ctx.progress.total.store(
        before + ctx.src.estimate(spec).unwrap_or(0),
        Ordering::Relaxed,
    );
    *ctx.progress.what.lock() = describe(spec);
    tracing::info!(job = %ctx.job.name, stream = %describe(spec), "replication stream starts");
    let (mut w, r) = pipe(ctx.job.bwlimit, ctx.progress.clone(), ctx.total.clone());
    let (recv, sent) = std::thread::scope(|s| {
        let src = ctx.src;
        let sender = s.spawn(move || match src.send(spec, &mut w) {
            Ok(()) => w
                .finish()
                .map_err(|e| Error::Stream(format!("sending the stream: {e}"))),
            Err(e) => {
                w.fail(e.to_string());
                Err(e)
            }
        });
        let recv = ctx.dst.receive(spec, Box::new(r));
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(Error::Stream("the sending thread panicked".into())));
        (recv, sent)
    });
    out.bytes += ctx.progress.bytes.load(Ordering::Relaxed) - before;
    // A receive state with no token yet (cut before its first snapshot's
    // data was kept) refuses new streams: discard it, the retry starts over.
    if let Err(e) = &recv {
        if e.to_string().contains("partially-complete state") {
            match ctx.dst.receive_abort() {
                Ok(()) => out.notes.push(format!(
                    "discarded an unfinished receive on {} with no resume point",
                    ctx.dst.describe()
                )),
                Err(a) => out
                    .notes
                    .push(format!("cannot discard the unfinished receive: {a}")),
            }
        }
    }
    match (recv, sent) {
        (Ok(()), Ok(())) => {
            out.streams.push(describe(spec));
            Ok(())
        }
        (Err(e), Ok(())) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        // The receiver saw the sender's failure: the sender's error says why.
        (Err(re), Err(se)) => Err(Error::Stream(format!(
            "sending {} failed: {se} (receiving side: {re})",
            describe(spec)
        ))),
    }
}

fn describe(spec: &StreamSpec) -> String {
    match (&spec.resume_token, &spec.from) {
        (Some(_), _) => format!("resume into {}", spec.target),
        (None, Some(from)) => {
            let short = spec.snapshot.split_once('@').map_or("", |(_, s)| s);
            format!("{from}..@{short}")
        }
        (None, None) => spec.snapshot.clone(),
    }
}

fn names(snaps: &[&Snap]) -> String {
    snaps
        .iter()
        .map(|s| format!("@{}", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn same(a: &Snap, b: &Snap) -> bool {
    a.name == b.name
        && match (&a.guid, &b.guid) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

/// The newest source snapshot the target also has.
pub fn common<'a>(src: &'a [Snap], dst: &[Snap]) -> Option<&'a Snap> {
    src.iter().rev().find(|s| dst.iter().any(|d| same(s, d)))
}

/// What changed on the target since `common`: its snapshots made after it,
/// and bytes written since its newest snapshot. None: unchanged.
pub fn divergence(
    dst: &[Snap],
    common: &Snap,
    written: u64,
    names_changed: usize,
    target: &str,
) -> Option<String> {
    let pos = dst.iter().position(|d| d.name == common.name)?;
    let newer: Vec<&Snap> = dst[pos + 1..].iter().collect();
    let mut what = Vec::new();
    if !newer.is_empty() {
        what.push(format!(
            "snapshot{} {} made there after it",
            if newer.len() == 1 { "" } else { "s" },
            names(&newer)
        ));
    }
    if written > 0 {
        let since = newer
            .last()
            .map_or(common.name.as_str(), |s| s.name.as_str());
        what.push(format!(
            "{} written to {target} since @{since}",
            dataset::props::format_size(written)
        ));
    }
    if names_changed > 0 {
        let since = newer
            .last()
            .map_or(common.name.as_str(), |s| s.name.as_str());
        what.push(format!(
            "{names_changed} name{} changed in {target} since @{since}",
            if names_changed == 1 { "" } else { "s" }
        ));
    }
    (!what.is_empty()).then(|| {
        format!(
            "{target} was modified since the last common snapshot @{}: {}; refusing (--force rolls it back to @{})",
            common.name,
            what.join("; "),
            common.name
        )
    })
}

/// Destroys what `policy`'s grid does not keep on `side`, never `keep`.
pub fn prune(
    side: &dyn Side,
    policy_name: &str,
    policies: &Policies,
    keep: &str,
    now: i64,
) -> Result<Vec<String>> {
    let policy = policies
        .get(policy_name)
        .map_err(|e| Error::Invalid(format!("policy '{policy_name}': {e}")))?;
    let entries: Vec<SnapshotEntry> = side
        .snapshots()?
        .into_iter()
        .map(|s| SnapshotEntry {
            held: s.holds > 0 || s.name == keep,
            name: s.name,
            created: s.created,
        })
        .collect();
    let plan = policy::plan(
        policy,
        Input {
            now,
            snapshots: &entries,
            last_run: None,
            force: false,
            take: false,
        },
        None,
    );
    let doomed: Vec<String> = plan
        .destroy
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != keep)
        .collect();
    side.destroy_snapshots(&doomed)?;
    Ok(doomed)
}

/// One run: what it did, and why it failed if it did (after doing that much).
pub fn run(ctx: &Ctx) -> (Outcome, Option<Error>) {
    let mut out = Outcome::default();
    let err = run_inner(ctx, &mut out).err();
    (out, err)
}

fn run_inner(ctx: &Ctx, out: &mut Outcome) -> Result<()> {
    let (src, dst) = (ctx.src, ctx.dst);
    let target = dst.dataset().to_string();
    // A retry right after a cut: the token is final once that receive ended.
    dst.receive_wait()?;
    let mut state = dst.state()?;
    // 1. An interrupted receive continues where it stopped.
    if let Some(token) = state.as_ref().and_then(|s| s.resume_token.clone()) {
        let spec = StreamSpec {
            resume_token: Some(token),
            target: target.clone(),
            ..Default::default()
        };
        tracing::info!(job = %ctx.job.name, target = %dst.describe(), "resuming an interrupted transfer");
        out.resumed = true;
        transfer(ctx, &spec, out)?;
        state = dst.state()?;
    }
    let src_snaps = src.snapshots()?;
    let Some(newest) = src_snaps.last() else {
        return Err(Error::Invalid(format!(
            "{} has no snapshot to send: take one (cistern snapshot) or give it a snapshot policy",
            src.describe()
        )));
    };
    let dst_snaps = match &state {
        Some(_) => dst.snapshots()?,
        None => Vec::new(),
    };
    let common = common(&src_snaps, &dst_snaps).cloned();
    // 2. Refuse (or with --force roll back) a target changed since the common snapshot.
    let mut force_full = false;
    match (&state, &common) {
        (Some(st), Some(c)) => {
            // `written` counts committed blocks; diff also sees what is
            // still in the open txg (and bucket keys).
            let newest_dst = dst_snaps.last().map_or(c.name.clone(), |s| s.name.clone());
            let (bytes, names) = dst.changed_since(&newest_dst).unwrap_or((st.written, 0));
            let written = bytes.max(st.written);
            if let Some(why) = divergence(&dst_snaps, c, written, names, &dst.describe()) {
                if !ctx.force {
                    return Err(Error::Diverged(why));
                }
                tracing::warn!(job = %ctx.job.name, "{why}: --force, rolling back");
                dst.rollback(&c.name)?;
                out.notes
                    .push(format!("rolled {} back to @{}", dst.describe(), c.name));
            }
        }
        (Some(_), None) if dst_snaps.is_empty() && ctx.partial_full => {
            // What a cut full stream of this job left: start it again.
            tracing::info!(job = %ctx.job.name, target = %dst.describe(), "replacing what an interrupted full transfer left");
            dst.destroy_all()?;
            out.notes.push(format!(
                "restarted the interrupted full transfer into {}",
                dst.describe()
            ));
        }
        (Some(_), None) => {
            let list: Vec<&Snap> = dst_snaps.iter().collect();
            let has = if list.is_empty() {
                String::new()
            } else {
                format!(" (it has {})", names(&list))
            };
            if !ctx.force {
                return Err(Error::Diverged(format!(
                    "{} exists and has no snapshot in common with {}{has}; refusing (--force replaces it)",
                    dst.describe(),
                    src.describe()
                )));
            }
            tracing::warn!(job = %ctx.job.name, target = %dst.describe(), "--force: replacing a target with no snapshot in common");
            dst.destroy_all()?;
            out.notes.push(format!("replaced {}{has}", dst.describe()));
            force_full = true;
        }
        (None, _) => {}
    }
    // 3. The streams.
    let full = |s: &Snap| format!("{}@{}", src.dataset(), s.name);
    let from = match &common {
        Some(c) => c.clone(),
        None => {
            let first = &src_snaps[0];
            let spec = StreamSpec {
                snapshot: full(first),
                target: target.clone(),
                force: force_full,
                ..Default::default()
            };
            (ctx.mark_full)(true);
            transfer(ctx, &spec, out)?;
            (ctx.mark_full)(false);
            first.clone()
        }
    };
    if from.name != newest.name {
        let spec = StreamSpec {
            snapshot: full(newest),
            from: Some(full(&from)),
            target: target.clone(),
            ..Default::default()
        };
        transfer(ctx, &spec, out)?;
    } else if common.is_some() && !out.resumed {
        out.up_to_date = true;
    }
    // 4. Read-only on the target (still exportable and clonable).
    if dst.state()?.is_some_and(|s| !s.readonly) {
        dst.set_readonly()?;
    }
    // 5. Hold the new common snapshot on both sides, then release the old.
    let tag = ctx.job.hold_tag();
    let new_common = newest.name.clone();
    src.hold(&new_common, &tag)?;
    dst.hold(&new_common, &tag)?;
    out.common = Some(new_common.clone());
    let olds: Vec<String> = [ctx.last_common.clone(), common.map(|c| c.name)]
        .into_iter()
        .flatten()
        .filter(|o| *o != new_common)
        .collect();
    for old in olds {
        for side in [src, dst] {
            if let Err(e) = side.release(&old, &tag) {
                out.notes.push(format!(
                    "cannot release hold {tag} on {}@{old}: {e}",
                    side.describe()
                ));
            }
        }
    }
    // 6. Prune each side with its own grid.
    if let Some(p) = &ctx.job.source_policy {
        out.pruned_source = prune(src, p, ctx.policies, &new_common, ctx.now)?;
    }
    if let Some(p) = &ctx.job.policy {
        out.pruned_target = prune(dst, p, ctx.policies, &new_common, ctx.now)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(name: &str, txg: u64) -> Snap {
        Snap {
            name: name.into(),
            created: txg as i64,
            txg,
            holds: 0,
            guid: None,
        }
    }

    #[test]
    fn common_is_the_newest_shared_snapshot() {
        let src = [snap("a", 1), snap("b", 2), snap("c", 3)];
        let dst = [snap("a", 10), snap("b", 11)];
        assert_eq!(common(&src, &dst).unwrap().name, "b");
        assert!(common(&src, &[snap("x", 1)]).is_none());
        // Same name, different guids: not the same snapshot.
        let mut g1 = snap("b", 2);
        g1.guid = Some("1".into());
        let mut g2 = snap("b", 11);
        g2.guid = Some("2".into());
        assert_eq!(
            common(&[snap("a", 1), g1], &[snap("a", 1), g2])
                .unwrap()
                .name,
            "a"
        );
    }

    #[test]
    fn divergence_names_what_changed() {
        let c = snap("b", 2);
        let dst = [snap("a", 1), snap("b", 2)];
        assert_eq!(divergence(&dst, &c, 0, 0, "t/v"), None);
        let why = divergence(&dst, &c, 8192, 0, "t/v").unwrap();
        assert!(why.contains("8K written to t/v since @b"), "{why}");
        let dst = [
            snap("a", 1),
            snap("b", 2),
            snap("local1", 3),
            snap("local2", 4),
        ];
        let why = divergence(&dst, &c, 0, 0, "t/v").unwrap();
        assert!(
            why.contains("snapshots @local1, @local2 made there"),
            "{why}"
        );
        assert!(why.contains("last common snapshot @b"), "{why}");
        assert!(why.contains("--force"), "{why}");
    }
}

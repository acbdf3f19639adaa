//! `cistern snapshot|rollback|clone|promote|hold|release|holds|diff`: zfs-style
//! snapshot commands.

use crate::cmd::props::parse_assignment;
use crate::cmd::OutputFlags;
use crate::format::{size_cell, Table};
use crate::output::{json, out, outln};
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Snapshot every dataset below too, all at one point in time.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// POOL/DS@NAME (several: taken together, atomically).
    #[arg(value_name = "POOL/DS@NAME", required = true, num_args = 1..)]
    pub names: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// Destroy snapshots newer than the one rolled back to.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Disconnect the dataset's clients (they get ESHUTDOWN; their cached
    /// view of the data would be wrong after the rollback) instead of refusing.
    #[arg(short = 'f')]
    pub force: bool,
    /// POOL/DS@NAME
    pub snapshot: String,
}

#[derive(Debug, Args)]
pub struct CloneArgs {
    /// Property for the clone (repeatable).
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    pub props: Vec<String>,
    /// POOL/DS@NAME
    pub snapshot: String,
    /// POOL/NEW
    pub name: String,
}

#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// POOL/CLONE
    pub clone: String,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The same snapshot of every dataset below too.
    #[arg(short = 'r')]
    pub recursive: bool,
    pub tag: String,
    #[arg(value_name = "POOL/DS@NAME", required = true, num_args = 1..)]
    pub snapshots: Vec<String>,
}

#[derive(Debug, Args)]
pub struct HoldsArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    #[arg(value_name = "POOL/DS@NAME", required = true, num_args = 1..)]
    pub snapshots: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// POOL/DS@NAME
    pub from: String,
    /// A later snapshot of the same dataset, or the dataset (default: the dataset now).
    pub to: Option<String>,
}

pub fn snapshot(client: &api::Client, a: SnapshotArgs) -> Result<()> {
    client.snapshot(&a.names, a.recursive)?;
    Ok(())
}

pub fn rollback(client: &api::Client, a: RollbackArgs) -> Result<()> {
    for name in client.rollback_with(&a.snapshot, a.recursive, a.force)? {
        outln(&format!("destroyed {name}"));
    }
    Ok(())
}

pub fn clone(client: &api::Client, a: CloneArgs) -> Result<()> {
    let props = a
        .props
        .iter()
        .map(|p| parse_assignment(p))
        .collect::<Result<Vec<_>>>()?;
    client.clone_snapshot(&a.snapshot, &a.name, &props)?;
    Ok(())
}

pub fn promote(client: &api::Client, a: PromoteArgs) -> Result<()> {
    client.promote(&a.clone)?;
    Ok(())
}

pub fn hold(client: &api::Client, a: HoldArgs, hold: bool) -> Result<()> {
    client.set_hold(&a.tag, &a.snapshots, a.recursive, hold)?;
    Ok(())
}

pub fn holds(client: &api::Client, a: HoldsArgs) -> Result<()> {
    let rows = client.holds(&a.snapshots)?;
    if a.format.json {
        return json(&rows);
    }
    let mut t = Table::new(&["NAME".to_string(), "TAG".to_string()]);
    for (name, tag) in rows {
        t.push(vec![name, tag]);
    }
    out(&t.render(a.format.scripted));
    Ok(())
}

/// `OFFSET LENGTH` per changed range (bytes with -p, human sizes otherwise);
/// for a bucket or filesystem, `CHANGE<TAB>NAME` per name as zfs diff prints.
pub fn diff(client: &api::Client, a: DiffArgs) -> Result<()> {
    let report = client.diff(&a.from, a.to.as_deref())?;
    if a.format.json {
        return json(&report);
    }
    if !report.names.is_empty() {
        let lines: Vec<String> = report
            .names
            .iter()
            .map(|n| match &n.renamed_to {
                Some(to) => format!("{}\t{}\t-> {}\n", n.change, n.name, to),
                None => format!("{}\t{}\n", n.change, n.name),
            })
            .collect();
        out(&lines.concat());
        return Ok(());
    }
    let size = |n: u64| size_cell(n, a.format.parsable);
    let mut t = Table::new(&["OFFSET".to_string(), "LENGTH".to_string()]);
    t.align_right(0);
    t.align_right(1);
    for r in &report.ranges {
        t.push(vec![size(r.offset), size(r.length)]);
    }
    out(&t.render(a.format.scripted));
    Ok(())
}

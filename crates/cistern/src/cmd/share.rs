//! `cistern share` / `cistern unshare`, as zfs: `-a [smb|nfs]` or one
//! filesystem. The daemon shares what `sharesmb`/`sharenfs`/`timemachine`
//! ask for by itself; these take shares down and back up without changing
//! a property (an unshare lasts until `share` or a daemon restart).

use anyhow::{bail, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct ShareArgs {
    /// Every filesystem with sharesmb/sharenfs set (optionally one protocol: -a smb).
    #[arg(short = 'a')]
    pub all: bool,
    /// FILESYSTEM, or with -a: smb or nfs.
    pub target: Option<String>,
}

/// (dataset, protocol) from the arguments.
fn parse(a: &ShareArgs, verb: &str) -> Result<(Option<String>, Option<String>)> {
    match (a.all, a.target.as_deref()) {
        (true, None) => Ok((None, None)),
        (true, Some(p @ ("smb" | "nfs"))) => Ok((None, Some(p.to_string()))),
        (true, Some(other)) => bail!("-a takes smb or nfs, not '{other}'"),
        (false, Some(ds)) => Ok((Some(ds.to_string()), None)),
        (false, None) => bail!("missing the filesystem: cistern {verb} -a | FILESYSTEM"),
    }
}

pub fn share(client: &api::Client, a: ShareArgs) -> Result<()> {
    let (dataset, protocol) = parse(&a, "share")?;
    let list = client.share(dataset.as_deref(), protocol.as_deref())?;
    for p in &list.problems {
        eprintln!(
            "cannot share '{}' over {}: {}",
            p.dataset, p.protocol, p.why
        );
    }
    if !list.problems.is_empty() {
        bail!("{} filesystem(s) not shared", list.problems.len());
    }
    Ok(())
}

pub fn unshare(client: &api::Client, a: ShareArgs) -> Result<()> {
    let (dataset, protocol) = parse(&a, "unshare")?;
    client.unshare(dataset.as_deref(), protocol.as_deref())?;
    Ok(())
}

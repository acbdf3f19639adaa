//! `cistern send` and `cistern receive` (`recv`): zfs send streams through
//! the daemon, on standard output and standard input.

use crate::format::human_size;
use crate::output::outln;
use anyhow::{bail, Result};
use clap::Args;
use std::io::IsTerminal;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Incremental from this snapshot (`@snap` or `POOL/DS@snap`).
    #[arg(
        short = 'i',
        value_name = "SNAPSHOT",
        conflicts_with = "intermediates_from"
    )]
    pub from: Option<String>,
    /// Incremental from this snapshot, with every snapshot in between.
    #[arg(short = 'I', value_name = "SNAPSHOT")]
    pub intermediates_from: Option<String>,
    /// The dataset, its children, their snapshots and properties.
    #[arg(short = 'R')]
    pub recursive: bool,
    /// Raw: blocks exactly as stored (compressed, encrypted).
    #[arg(short = 'w', long = "raw")]
    pub raw: bool,
    /// Dry run: send nothing (with -v: print the estimated size).
    #[arg(short = 'n')]
    pub dry_run: bool,
    /// Print what is sent and its size.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Parsable verbose output.
    #[arg(short = 'P')]
    pub parsable: bool,
    /// Continue an interrupted transfer (the target's receive_resume_token).
    // Not `token`: that id is the global --token (the API's).
    #[arg(short = 't', value_name = "TOKEN")]
    pub resume_token: Option<String>,
    /// POOL/DS@SNAP
    #[arg(required_unless_present = "resume_token")]
    pub snapshot: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Roll the target back to its most recent snapshot first (and destroy
    /// snapshots newer than the stream's source).
    #[arg(short = 'F')]
    pub force: bool,
    /// Keep the state of an interrupted receive (resume with `send -t`).
    #[arg(short = 's')]
    pub resumable: bool,
    /// Abort an interrupted receive: discard its partial state.
    #[arg(short = 'A')]
    pub abort: bool,
    /// Do not mount what is received (nothing is mounted by a receive here).
    #[arg(short = 'u')]
    pub no_mount: bool,
    /// Print what is received and its size.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// POOL/DS or POOL/DS@SNAP
    pub dataset: String,
}

#[derive(Debug, Args)]
pub struct BookmarkArgs {
    /// POOL/DS@SNAP
    pub snapshot: String,
    /// POOL/DS#NAME, or #NAME (in the snapshot's dataset).
    pub bookmark: String,
}

/// `cistern bookmark POOL/DS@SNAP POOL/DS#NAME`.
pub fn bookmark(client: &api::Client, a: BookmarkArgs) -> Result<()> {
    if !a.bookmark.contains('#') {
        bail!(
            "cannot create bookmark '{}': not a bookmark name (POOL/DS#NAME or #NAME)",
            a.bookmark
        );
    }
    client.bookmark(&a.snapshot, &a.bookmark)?;
    Ok(())
}

/// Standard output or input as the file it is, for a stream: Rust's
/// stdout is line-buffered (it scans every piece for a newline and writes
/// in small pieces) and stdin reads through an 8 KiB buffer; the stream
/// moves in MiB pieces instead. A pipe is grown to 1 MiB (as far as
/// /proc/sys/fs/pipe-max-size allows) so each side blocks, and switches,
/// once per MiB rather than per 64 KiB. The caller keeps the std handle
/// locked meanwhile so nothing else writes or reads around it.
fn raw_stdio(fd: &impl std::os::fd::AsFd) -> std::mem::ManuallyDrop<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: F_SETPIPE_SZ only resizes a pipe's buffer; on anything that
    // is not a pipe it fails and nothing changes.
    unsafe {
        libc::fcntl(
            raw,
            libc::F_SETPIPE_SZ,
            api::client::STREAM_BUF as libc::c_int,
        );
    }
    // SAFETY: the descriptor stays open for the process's life (a standard
    // stream), and ManuallyDrop never closes it.
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(raw) })
}

fn options(a: &SendArgs) -> dataset::SendOptions {
    dataset::SendOptions {
        snapshot: a.snapshot.clone().unwrap_or_default(),
        from: a.from.clone().or_else(|| a.intermediates_from.clone()),
        intermediates: a.intermediates_from.is_some(),
        recursive: a.recursive,
        raw: a.raw,
        resume_token: a.resume_token.clone(),
    }
}

pub fn send(client: &api::Client, a: SendArgs) -> Result<()> {
    let opts = options(&a);
    let what = match &opts.from {
        Some(f) => format!("incremental send of {} from {f}", opts.snapshot),
        None => format!("full send of {}", opts.snapshot),
    };
    // As zfs: with -n the report goes to stdout, else to stderr (stdout is the stream).
    let report = |line: String| {
        if a.dry_run {
            outln(&line);
        } else {
            eprintln!("{line}");
        }
    };
    if a.dry_run || a.verbose || a.parsable {
        let est = client.send_estimate(&opts)?;
        if a.verbose || a.parsable {
            if a.parsable {
                let kind = if opts.from.is_some() {
                    "incremental"
                } else {
                    "full"
                };
                report(format!("{kind}\t{}\t{est}", opts.snapshot));
                report(format!("size\t{est}"));
            } else {
                report(format!("{what} estimated size is {}", human_size(est)));
                report(format!("total estimated size is {}", human_size(est)));
            }
        }
        if a.dry_run {
            return Ok(());
        }
    }
    let stdout = std::io::stdout().lock();
    if stdout.is_terminal() {
        bail!("Stream can not be written to a terminal.\nYou must redirect standard output.");
    }
    let mut out = raw_stdio(&stdout);
    let started = std::time::Instant::now();
    // A daemon on this host writes into our standard output itself.
    let n = match api::send_local::send(client, &opts, std::os::fd::AsFd::as_fd(&*out)) {
        Some(n) => n?,
        None => client.send(&opts, &mut *out)?,
    };
    std::io::Write::flush(&mut *out)?;
    drop(stdout);
    if a.verbose {
        let secs = started.elapsed().as_secs_f64().max(0.001);
        eprintln!(
            "sent {} stream in {secs:.1} seconds ({}/sec)",
            human_size(n),
            human_size((n as f64 / secs) as u64)
        );
    }
    Ok(())
}

pub fn receive(client: &api::Client, a: ReceiveArgs) -> Result<()> {
    if a.abort {
        client.receive_abort(&a.dataset)?;
        return Ok(());
    }
    let stdin = std::io::stdin().lock();
    if stdin.is_terminal() {
        bail!("Stream can not be read from a terminal.\nYou must redirect standard input.");
    }
    let mut inp = raw_stdio(&stdin);
    let opts = dataset::ReceiveOptions {
        target: a.dataset.clone(),
        force: a.force,
        resumable: a.resumable,
    };
    let started = std::time::Instant::now();
    // A daemon on this host reads our standard input itself.
    let sum = match api::send_local::receive(client, &opts, std::os::fd::AsFd::as_fd(&*inp)) {
        Some(sum) => sum?,
        None => client.receive(&opts, &mut *inp)?,
    };
    drop(stdin);
    if a.verbose {
        for s in &sum.snapshots {
            outln(&format!("received {s}"));
        }
        let secs = started.elapsed().as_secs_f64().max(0.001);
        outln(&format!(
            "received {} stream in {secs:.1} seconds ({}/sec)",
            human_size(sum.bytes),
            human_size((sum.bytes as f64 / secs) as u64)
        ));
    }
    Ok(())
}

//! `cistern pool ...`: zpool-style pool management.

use crate::cmd::{size_arg, split_list, OutputFlags};
use crate::format::{human_size, size_cell, Table};
use crate::output::{json, out, outln};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use dataset::{
    GroupKind, GroupSpec, GroupStatus, ImportablePool, PoolSpec, PoolStatus, PoolSummary,
    ScanFunction, ScanState, ScanStatus, ScrubAction,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Create a pool: `cistern pool create [-s 8G] tank mirror d0 d1`.
    Create(CreateArgs),
    /// List pools with their size and health.
    List(ListArgs),
    /// Show the device tree and error counters of pools.
    Status(StatusArgs),
    /// Destroy a pool and all its data (-f: even with NBD clients connected).
    Destroy(ForcePoolArg),
    /// Commit and close a pool; it can be imported again later (-f: even
    /// with NBD clients connected).
    Export(ForcePoolArg),
    /// Import a pool, or without POOL list the pools that can be imported.
    Import(ImportArgs),
    /// Take over a pool that lives in a bucket: `cistern pool takeover tank
    /// s3://bucket/prefix`. Its previous owner is fenced (its next write
    /// fails; it acknowledges nothing more); no lease or clock is involved.
    Takeover(TakeoverArgs),
    /// Compare layouts for N drives before buying them: capacity, failures
    /// survived, predicted IOPS and MB/s (`-n 12 --size 8T --iops 180 --mbps 250`).
    Plan(Box<crate::cmd::plan::PlanArgs>),
    /// Verify every block and metadata page in the background, repairing from
    /// redundancy: `cistern pool scrub [-w] [-p|-s] POOL`.
    Scrub(ScrubArgs),
    /// Take a device out of service (no more reads or writes to it).
    Offline(DeviceArgs),
    /// Bring an offlined or faulted device back; it is resilvered.
    Online(DeviceArgs),
    /// Reset error counters of the pool or one device; FAULTED devices are retried.
    Clear(ClearArgs),
    /// Replace a device with another (which must exist) and resilver onto it.
    Replace(ReplaceArgs),
    /// Add groups to a pool: `cistern pool add tank raidz2 d6 d7 d8 d9`.
    Add(AddArgs),
    /// Mirror a device onto NEW (a single disk becomes a mirror, a mirror
    /// gets one more copy); NEW is resilvered.
    Attach(AttachArgs),
    /// Take a device out of its mirror.
    Detach(DeviceArgs),
    /// Remove a top-level group (today: the last one, if it holds no data),
    /// or the log device (the log moves back to the pool's devices first).
    Remove(DeviceArgs),
    /// I/O statistics: `cistern pool iostat [-v] [-l] [-w] [-H] [-p] [POOL] [INTERVAL [COUNT]]`.
    Iostat(crate::cmd::iostat::IostatArgs),
    /// Show the commands that changed pools: `cistern pool history [-il] [POOL]...`.
    History(HistoryArgs),
    /// Show the pools' events (errors, state changes, scans): `[-fvHc] [POOL]`.
    Events(EventsArgs),
    /// Wait until activities end: `cistern pool wait [-t scrub,resilver,replace] POOL`.
    Wait(WaitArgs),
    /// Wipe the pool label of a device that is not part of an imported pool.
    Labelclear(LabelclearArgs),
    /// Show the pools' format versions, or upgrade them: `[-v] [-a|POOL]`.
    Upgrade(UpgradeArgs),
    /// Show pool properties: `cistern pool get [-H] [-p] [-o FIELDS] all|PROP[,PROP] POOL`.
    Get(PoolGetArgs),
    /// Set a pool property: `cistern pool set failmode=continue POOL`.
    Set(PoolSetArgs),
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Use NEW even if it holds the label of a pool that is not imported.
    #[arg(short = 'f')]
    pub force: bool,
    /// Wait until the resilver has finished.
    #[arg(short = 'w')]
    pub wait: bool,
    pub pool: String,
    /// The device to mirror: path, file name or guid.
    pub device: String,
    /// The new device: an existing file or block device.
    pub new: PathBuf,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Also internal events (scans, layout changes) with their txg.
    #[arg(short = 'i')]
    pub internal: bool,
    /// Long format: who ran each command, on which host.
    #[arg(short = 'l')]
    pub long: bool,
    /// Pools (default: all).
    pub pools: Vec<String>,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Follow: keep printing new events as they come (Ctrl-C to stop).
    #[arg(short = 'f')]
    pub follow: bool,
    /// Print every field of each event.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Scripted: no header, tab-separated.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Clear the events.
    #[arg(short = 'c', conflicts_with_all = ["follow", "verbose"])]
    pub clear: bool,
    /// Print JSON (one object per event with -f).
    #[arg(long)]
    pub json: bool,
    /// Only this pool's events.
    pub pool: Option<String>,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Activities to wait for: scrub, resilver, replace (default: all).
    #[arg(short = 't', value_name = "ACTIVITY[,...]")]
    pub activities: Option<String>,
    pub pool: String,
}

#[derive(Debug, Args)]
pub struct LabelclearArgs {
    /// Clear even if the label says its pool was not exported.
    #[arg(short = 'f')]
    pub force: bool,
    pub device: PathBuf,
}

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// Upgrade every imported pool.
    #[arg(short = 'a', conflicts_with = "pool")]
    pub all: bool,
    /// List the format versions this build supports.
    #[arg(short = 'v')]
    pub verbose: bool,
    pub pool: Option<String>,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Create missing device files as sparse files of this size (e.g. 8G).
    #[arg(short = 's', long = "size", value_name = "SIZE", value_parser = size_arg)]
    pub size: Option<u64>,
    /// Use devices even if they hold a label of another pool.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    pub pool: String,
    /// Groups, as for create: `d0`, `mirror a b`, `raidz1 a b c`...
    #[arg(value_name = "VDEV", required = true, num_args = 1..)]
    pub vdevs: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ScrubArgs {
    /// Wait until the scrub has finished (or was paused or canceled).
    #[arg(short = 'w')]
    pub wait: bool,
    /// Pause the scrub; `cistern pool scrub POOL` resumes it.
    #[arg(short = 'p', conflicts_with = "stop")]
    pub pause: bool,
    /// Stop (cancel) the scrub.
    #[arg(short = 's')]
    pub stop: bool,
    pub pool: String,
}

#[derive(Debug, Args)]
pub struct DeviceArgs {
    pub pool: String,
    /// Device path, file name, or guid.
    pub device: String,
}

#[derive(Debug, Args)]
pub struct ClearArgs {
    pub pool: String,
    /// Only this device (path, file name or guid).
    pub device: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReplaceArgs {
    /// Use NEW even if it holds the label of a pool that is not imported.
    #[arg(short = 'f')]
    pub force: bool,
    /// Wait until the resilver has finished.
    #[arg(short = 'w')]
    pub wait: bool,
    pub pool: String,
    /// The device to replace: path, file name, or guid (for a missing device).
    pub old: String,
    /// The new device: an existing file or block device.
    pub new: PathBuf,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Create missing device files as sparse files of this size (e.g. 8G).
    #[arg(short = 's', long = "size", value_name = "SIZE", value_parser = size_arg)]
    pub size: Option<u64>,
    /// Use devices even if they hold a label of another pool.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Name of the new pool.
    pub pool: String,
    /// Devices: `d0 d1` (stripe), `mirror d0 d1` (mirror), `mirror a b mirror c d`,
    /// `raidz1 a b c` (also raidz2, raidz3; `raidz` = raidz1).
    #[arg(value_name = "VDEV", required = true, num_args = 1..)]
    pub vdevs: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Columns: name,size,alloc,free,cap,health,guid,txg.
    #[arg(short = 'o', value_name = "COLS")]
    pub columns: Option<String>,
    /// Pools to show (default: all).
    pub pools: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Only pools that are not healthy ("all pools are healthy" if none).
    #[arg(short = 'x')]
    pub unhealthy: bool,
    /// List the blocks that could not be repaired (dataset and byte offset).
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Pool to show (default: all).
    pub pool: Option<String>,
}

#[derive(Debug, Args)]
pub struct PoolArg {
    pub pool: String,
}

#[derive(Debug, Args)]
pub struct ForcePoolArg {
    /// Disconnect clients of the pool's volumes and snapshots (they get
    /// ESHUTDOWN) instead of refusing because the pool is busy.
    #[arg(short = 'f')]
    pub force: bool,
    pub pool: String,
}

#[derive(Debug, Args)]
pub struct TakeoverArgs {
    /// Pool name (as created).
    pub pool: String,
    /// Where the pool lives: s3://BUCKET/PREFIX or file:///DIR. Leave it
    /// out on a daemon started with `serve --standby POOL LOCATION`.
    pub location: Option<String>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Directory to search for devices (repeatable; default: the current directory).
    #[arg(short = 'd', value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print JSON (when listing importable pools).
    #[arg(long)]
    pub json: bool,
    /// Import a pool that another daemon or host seems to hold, once the
    /// activity check sees its MMP stamps stay still.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Import even though the log device is missing: sync writes that only
    /// it held are lost (zpool import -m).
    #[arg(short = 'm')]
    pub missing_log: bool,
    /// Pool name or numeric id to import.
    pub pool: Option<String>,
}

pub fn run(client: &api::Client, cmd: PoolCommand) -> Result<()> {
    match cmd {
        PoolCommand::Create(a) => create(client, a),
        PoolCommand::Add(a) => add(client, a),
        PoolCommand::List(a) => list(client, a),
        PoolCommand::Status(a) => status(client, a),
        PoolCommand::Destroy(a) => Ok(client.destroy_pool_with(&a.pool, a.force)?),
        PoolCommand::Export(a) => Ok(client.export_pool_with(&a.pool, a.force)?),
        PoolCommand::Import(a) => import(client, a),
        PoolCommand::Takeover(a) => {
            let dirs: Vec<PathBuf> = a.location.iter().map(PathBuf::from).collect();
            let st = client.import_pool(&a.pool, &dirs, true)?;
            let from = match &a.location {
                Some(l) => l.clone(),
                None => st
                    .groups
                    .first()
                    .map(|g| g.name.clone())
                    .unwrap_or_else(|| "its standby".into()),
            };
            println!("pool '{}' taken over from {from}", st.summary.name);
            Ok(())
        }
        PoolCommand::Iostat(a) => crate::cmd::iostat::run(client, a),
        PoolCommand::Plan(a) => crate::cmd::plan::run(*a),
        PoolCommand::Scrub(a) => scrub(client, a),
        PoolCommand::Offline(a) => {
            client.offline(&a.pool, &a.device)?;
            Ok(())
        }
        PoolCommand::Online(a) => {
            client.online(&a.pool, &a.device)?;
            Ok(())
        }
        PoolCommand::Clear(a) => {
            client.clear(&a.pool, a.device.as_deref())?;
            Ok(())
        }
        PoolCommand::Replace(a) => replace(client, a),
        PoolCommand::Attach(a) => attach(client, a),
        PoolCommand::Detach(a) => {
            client.detach(&a.pool, &a.device)?;
            Ok(())
        }
        PoolCommand::Remove(a) => {
            client.remove(&a.pool, &a.device)?;
            Ok(())
        }
        PoolCommand::History(a) => history(client, a),
        PoolCommand::Events(a) => events(client, a),
        PoolCommand::Wait(a) => wait(client, a),
        PoolCommand::Labelclear(a) => {
            let dev = absolute(&a.device, &cwd()?);
            if !dev.exists() {
                bail!("{}: no such device", dev.display());
            }
            Ok(client.labelclear(&dev, a.force)?)
        }
        PoolCommand::Upgrade(a) => upgrade(client, a),
        PoolCommand::Get(a) => pool_get(client, a),
        PoolCommand::Set(a) => {
            let (prop, value) = crate::cmd::props::parse_assignment(&a.assignment)?;
            client.set_pool_property(&a.pool, &prop, &value)?;
            Ok(())
        }
    }
}

/// Who runs what, sent with every request so pool histories record it:
/// the command line as typed (program name without its directory), the
/// user and the host.
pub fn caller() -> dataset::Caller {
    let mut args = std::env::args();
    let prog = args
        .next()
        .map(|a| {
            Path::new(&a)
                .file_name()
                .map_or(a.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "cistern".into());
    let mut command = prog;
    // Secrets given on the command line never reach the pool's history.
    let mut secret_next = false;
    for a in args {
        command.push(' ');
        if secret_next {
            command.push_str("<redacted>");
        } else if a.starts_with("--token=") {
            command.push_str("--token=<redacted>");
        } else {
            command.push_str(&shell_quote(&a));
        }
        secret_next = a == "--token";
    }
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| {
            std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|l| l.split_whitespace().next().map(|u| format!("uid {u}")))
                })
                .unwrap_or_default()
        });
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    dataset::Caller {
        command,
        user,
        host,
    }
}

/// Quotes an argument the way a shell would need it.
fn shell_quote(a: &str) -> String {
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// The NEW device of `replace`/`attach`, made absolute; it must exist.
fn existing_device(path: &Path) -> Result<PathBuf> {
    let new = absolute(path, &cwd()?);
    if !new.exists() {
        bail!(
            "{} does not exist (create it first, e.g. `truncate -s SIZE {}`)",
            new.display(),
            new.display()
        );
    }
    Ok(new)
}

fn attach(client: &api::Client, a: AttachArgs) -> Result<()> {
    let new = existing_device(&a.new)?;
    client.attach(&a.pool, &a.device, &new, a.force)?;
    if a.wait {
        wait_scan(client, &a.pool, ScanFunction::Resilver)?;
    }
    Ok(())
}

/// `2026-11-23.18:42:53`, as zpool history prints times (UTC).
fn history_time(secs: u64) -> String {
    let (y, m, d) = civil(secs / 86400);
    format!(
        "{y:04}-{m:02}-{d:02}.{:02}:{:02}:{:02}",
        secs % 86400 / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// (year, month, day) of a day count since 1970-01-01.
fn civil(days: u64) -> (i64, u32, u32) {
    dataset::policy::time::civil_from_days(days as i64)
}

/// The `pool history` text of one pool.
pub fn render_history(
    pool: &str,
    records: &[dataset::HistoryRecord],
    internal: bool,
    long: bool,
) -> String {
    let mut o = format!("History for '{pool}':\n");
    for r in records.iter().filter(|r| internal || !r.internal) {
        let t = history_time(r.time);
        if r.internal {
            o.push_str(&format!("{t} [txg:{}] {}", r.txg, r.command));
        } else {
            o.push_str(&format!("{t} {}", r.command));
        }
        if long && !r.internal {
            let or_dash = |s: &str| {
                if s.is_empty() {
                    "-".to_string()
                } else {
                    s.to_string()
                }
            };
            o.push_str(&format!(
                " [user {} on {}]",
                or_dash(&r.user),
                or_dash(&r.host)
            ));
        }
        o.push('\n');
    }
    o
}

fn history(client: &api::Client, a: HistoryArgs) -> Result<()> {
    let pools = if a.pools.is_empty() {
        let mut names: Vec<String> = client.list_pools()?.into_iter().map(|p| p.name).collect();
        names.sort();
        if names.is_empty() {
            outln("no pools available");
            return Ok(());
        }
        names
    } else {
        a.pools.clone()
    };
    let mut text = Vec::new();
    for p in &pools {
        let records = client.history(p)?;
        text.push(render_history(p, &records, a.internal, a.long));
    }
    out(&text.join("\n"));
    Ok(())
}

/// `Nov 23 2026 18:42:53.123456789`, as zpool events prints times (UTC).
fn event_time(secs: u64, nanos: u32) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, m, d) = civil(secs / 86400);
    format!(
        "{} {d:2} {y} {:02}:{:02}:{:02}.{nanos:09}",
        MONTHS[(m - 1) as usize],
        secs % 86400 / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// One event as `zpool events` prints it (with -v, its fields below).
pub fn render_event(e: &dataset::Event, verbose: bool, scripted: bool) -> String {
    let time = event_time(e.time, e.nanos);
    let mut o = if scripted {
        format!("{time}\t{}\n", e.class)
    } else {
        format!("{time} {}\n", e.class)
    };
    if verbose {
        o.push_str(&format!("        class = \"{}\"\n", e.class));
        o.push_str(&format!("        pool = \"{}\"\n", e.pool));
        o.push_str(&format!("        pool_guid = {:#x}\n", e.pool_guid));
        for (k, v) in &e.fields {
            o.push_str(&format!("        {k} = \"{v}\"\n"));
        }
        o.push_str(&format!("        eid = {}\n", e.seq));
        o.push_str(&format!("        time = {} {}\n\n", e.time, e.nanos));
    }
    o
}

fn events(client: &api::Client, a: EventsArgs) -> Result<()> {
    use std::io::Write;
    let pools: Vec<String> = a.pool.iter().cloned().collect();
    if a.clear {
        let n = client.clear_events(&pools)?;
        outln(&format!("cleared {n} events"));
        return Ok(());
    }
    let print = |evs: &[dataset::Event]| -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        for e in evs {
            let text = if a.json {
                format!("{}\n", serde_json::to_string(e)?)
            } else {
                render_event(e, a.verbose, a.scripted)
            };
            // A closed pipe (`| head`) ends a follow quietly.
            if stdout.write_all(text.as_bytes()).is_err() {
                return Err(anyhow::anyhow!("stdout closed"));
            }
        }
        let _ = stdout.flush();
        Ok(())
    };
    let first = client.events(0, &pools, std::time::Duration::ZERO)?;
    if a.json && !a.follow {
        return json(&first);
    }
    if !a.scripted && !a.json {
        outln(&format!("{:<30} CLASS", "TIME"));
    }
    print(&first)?;
    if !a.follow {
        return Ok(());
    }
    let mut after = first.last().map_or(0, |e| e.seq);
    loop {
        // The daemon holds each request until an event comes (long poll),
        // so a new event prints at once.
        let evs = client.events(after, &pools, std::time::Duration::from_secs(5))?;
        if let Some(last) = evs.last() {
            after = last.seq;
        }
        if print(&evs).is_err() {
            return Ok(());
        }
    }
}

/// Activities `pool wait -t` knows, and the scan each one waits for.
const WAIT_ACTIVITIES: &[(&str, Option<ScanFunction>)] = &[
    ("scrub", Some(ScanFunction::Scrub)),
    ("resilver", Some(ScanFunction::Resilver)),
    ("replace", Some(ScanFunction::Resilver)),
];

fn wait(client: &api::Client, a: WaitArgs) -> Result<()> {
    let wanted: Vec<ScanFunction> = match &a.activities {
        None => vec![ScanFunction::Scrub, ScanFunction::Resilver],
        Some(list) => split_list(list)
            .iter()
            .map(|t| {
                WAIT_ACTIVITIES
                    .iter()
                    .find(|(n, _)| n == t)
                    .and_then(|(_, f)| *f)
                    .with_context(|| {
                        let names: Vec<&str> = WAIT_ACTIVITIES.iter().map(|(n, _)| *n).collect();
                        format!("invalid activity '{t}' (valid: {})", names.join(", "))
                    })
            })
            .collect::<Result<_>>()?,
    };
    loop {
        let s = client.pool_status(&a.pool)?;
        let busy = s.scan.as_ref().is_some_and(|scan| {
            scan.state == ScanState::Scanning && wanted.contains(&scan.function)
        });
        if !busy {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn upgrade(client: &api::Client, a: UpgradeArgs) -> Result<()> {
    if a.verbose {
        outln(&format!(
            "This build writes metadata format {} and device labels up to version {}.\n\
             Format history: metadata 1 (first release, no longer read), 2 (per-page checksums),\n\
             3 (objects), 4 (3 with an encryption root: older builds refuse it);\n\
             labels 1 (disks and mirrors), 2 (raidz, resilvering devices), 3 (log devices).",
            dataset::META_FORMAT,
            dataset::LABEL_VERSION
        ));
        if a.pool.is_none() && !a.all {
            return Ok(());
        }
    }
    let pools: Vec<String> = match (&a.pool, a.all) {
        (Some(p), _) => vec![p.clone()],
        (None, _) => {
            let mut names: Vec<String> = client.list_pools()?.into_iter().map(|p| p.name).collect();
            names.sort();
            names
        }
    };
    let apply = a.all || a.pool.is_some();
    let mut older = 0;
    for p in &pools {
        let v = client.upgrade(p, apply)?;
        let current = v.meta_format >= v.meta_format_supported;
        if !current {
            older += 1;
        }
        if !apply {
            if !current {
                outln(&format!(
                    "pool '{p}' has metadata format {} (this build: {}): `cistern pool upgrade {p}`",
                    v.meta_format, v.meta_format_supported
                ));
            }
            continue;
        }
        if v.upgraded.is_empty() {
            outln(&format!(
                "pool '{p}' already has the current format (metadata {}, labels {}): nothing to upgrade",
                v.meta_format, v.label_version
            ));
        } else {
            for what in &v.upgraded {
                outln(&format!("pool '{p}': {what}"));
            }
        }
    }
    if !apply {
        if pools.is_empty() {
            outln("no pools available");
        } else if older == 0 {
            outln(&format!(
                "All pools have the current format (metadata {}).",
                dataset::META_FORMAT
            ));
        }
    }
    Ok(())
}

fn scrub(client: &api::Client, a: ScrubArgs) -> Result<()> {
    let action = match (a.pause, a.stop) {
        (true, _) => ScrubAction::Pause,
        (_, true) => ScrubAction::Stop,
        _ => ScrubAction::Start,
    };
    client.scrub(&a.pool, action)?;
    if a.wait && action == ScrubAction::Start {
        let s = wait_scan(client, &a.pool, ScanFunction::Scrub)?;
        if s.errors > 0 {
            bail!(
                "scrub of '{}' finished with {} unrepaired errors (see `cistern pool status -v {}`)",
                a.pool,
                s.errors,
                a.pool
            );
        }
    }
    Ok(())
}

fn replace(client: &api::Client, a: ReplaceArgs) -> Result<()> {
    let new = existing_device(&a.new)?;
    client.replace(&a.pool, &a.old, &new, a.force)?;
    if a.wait {
        wait_scan(client, &a.pool, ScanFunction::Resilver)?;
    }
    Ok(())
}

/// Polls `pool status` until the scan of kind `function` is no longer
/// running; returns its final state.
fn wait_scan(client: &api::Client, pool: &str, function: ScanFunction) -> Result<ScanStatus> {
    loop {
        let s = client.pool_status(pool)?;
        match s.scan {
            Some(scan) if scan.function == function && scan.state == ScanState::Scanning => {}
            Some(scan) => return Ok(scan),
            None => bail!("pool '{pool}' has no scan"),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Parses a zpool vdev spec. `mirror` starts a mirror group that takes every
/// device up to the next keyword; devices outside a mirror are single-disk
/// groups (striped). Relative paths are made absolute against `cwd`.
pub fn parse_vdev_spec(words: &[String], cwd: &Path) -> Result<Vec<GroupSpec>> {
    let mut groups: Vec<GroupSpec> = Vec::new();
    let mut in_mirror = false;
    // After `log`: the groups that follow are log devices (SLOG).
    let mut in_log = false;
    let mut seen = HashSet::new();
    for w in words {
        match w.as_str() {
            "mirror" | "raidz" | "raidz1" | "raidz2" | "raidz3" => {
                in_mirror = true;
                if in_log && w != "mirror" {
                    bail!("a log is a device or a mirror, not {w}");
                }
                groups.push(GroupSpec {
                    kind: match w.as_str() {
                        "mirror" if in_log => GroupKind::LogMirror,
                        "mirror" => GroupKind::Mirror,
                        "raidz2" => GroupKind::Raidz2,
                        "raidz3" => GroupKind::Raidz3,
                        _ => GroupKind::Raidz1,
                    },
                    devices: Vec::new(),
                });
                continue;
            }
            "log" => {
                if in_log {
                    bail!("'log' is given twice");
                }
                in_log = true;
                in_mirror = false;
                continue;
            }
            "draid" | "spare" | "cache" | "special" | "dedup" => {
                bail!("'{w}' groups are not supported yet (use devices, mirror or raidz1/2/3)")
            }
            "" => bail!("empty device name"),
            _ => {}
        }
        // A pool in a bucket: its location is its one device (decision 0039).
        let path = if w.starts_with("s3://") || w.starts_with("file://") {
            PathBuf::from(w)
        } else {
            absolute(Path::new(w), cwd)
        };
        if !seen.insert(path.clone()) {
            bail!("device {} is given more than once", path.display());
        }
        if in_mirror {
            if let Some(g) = groups.last_mut() {
                g.devices.push(path);
            }
        } else {
            groups.push(GroupSpec {
                kind: if in_log {
                    GroupKind::Log
                } else {
                    GroupKind::Disk
                },
                devices: vec![path],
            });
        }
    }
    if groups.is_empty() {
        bail!("no devices given");
    }
    if in_log && !groups.iter().any(|g| g.kind.is_log()) {
        bail!("'log' must be followed by a device or `mirror A B`");
    }
    for (i, g) in groups.iter().enumerate() {
        if matches!(g.kind, GroupKind::Mirror | GroupKind::LogMirror) && g.devices.len() < 2 {
            bail!(
                "mirror-{i} needs at least 2 devices, got {}",
                g.devices.len()
            );
        }
        let parity = match g.kind {
            GroupKind::Raidz1 => 1,
            GroupKind::Raidz2 => 2,
            GroupKind::Raidz3 => 3,
            _ => 0,
        };
        if parity > 0 && g.devices.len() < parity + 1 {
            bail!(
                "raidz{parity}-{i} needs at least {} devices, got {}",
                parity + 1,
                g.devices.len()
            );
        }
    }
    Ok(groups)
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        let mut out = cwd.to_path_buf();
        for c in p.components() {
            match c {
                std::path::Component::CurDir => {}
                other => out.push(other),
            }
        }
        out
    }
}

fn cwd() -> Result<PathBuf> {
    std::env::current_dir().context("cannot find the current directory")
}

fn add(client: &api::Client, a: AddArgs) -> Result<()> {
    if a.vdevs.first().map(String::as_str) == Some("cache") {
        return add_cache(client, a);
    }
    let groups = parse_vdev_spec(&a.vdevs, &cwd()?)?;
    if !a.force {
        refuse_devices_of_other_pools(client, &groups)?;
    }
    let spec = dataset::PoolAddSpec {
        groups,
        create_size: a.size,
        force: a.force,
    };
    client.pool_add(&a.pool, &spec)?;
    Ok(())
}

/// `cistern pool add POOL cache DEV...`: L2ARC devices (decision 0029).
fn add_cache(client: &api::Client, a: AddArgs) -> Result<()> {
    let cwd = cwd()?;
    let devices: Vec<PathBuf> = a.vdevs[1..]
        .iter()
        .map(|d| absolute(Path::new(d), &cwd))
        .collect();
    if devices.is_empty() {
        bail!("name at least one cache device after 'cache'");
    }
    if let Some(bad) = a.vdevs[1..].iter().find(|w| {
        matches!(
            w.as_str(),
            "mirror" | "raidz" | "raidz1" | "raidz2" | "raidz3" | "log" | "cache" | "spare"
        )
    }) {
        bail!("cache devices are single devices: '{bad}' cannot follow 'cache'");
    }
    for d in &devices {
        if !d.exists() {
            bail!("{}: no such device", d.display());
        }
    }
    let spec = dataset::CacheAddSpec {
        devices,
        force: a.force,
    };
    client.pool_add_cache(&a.pool, &spec)?;
    Ok(())
}

fn create(client: &api::Client, a: CreateArgs) -> Result<()> {
    let groups = parse_vdev_spec(&a.vdevs, &cwd()?)?;
    if !a.force {
        refuse_devices_of_other_pools(client, &groups)?;
    }
    let spec = PoolSpec {
        name: a.pool,
        groups,
        create_size: a.size,
        force: a.force,
    };
    client.create_pool(&spec)?;
    Ok(())
}

/// Without -f, refuses devices that carry the label of an exported pool
/// (best effort: if the search itself fails, the engine decides).
fn refuse_devices_of_other_pools(client: &api::Client, groups: &[GroupSpec]) -> Result<()> {
    let devices: Vec<&PathBuf> = groups
        .iter()
        .flat_map(|g| &g.devices)
        .filter(|d| d.exists())
        .collect();
    if devices.is_empty() {
        return Ok(());
    }
    let mut dirs: Vec<PathBuf> = devices
        .iter()
        .filter_map(|d| d.parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    dirs.dedup();
    let found = match client.importable_pools(&dirs) {
        Ok(f) => f,
        Err(e @ api::ClientError::Unreachable { .. }) => return Err(e.into()),
        Err(e) => {
            tracing::debug!("cannot check devices for labels: {e}");
            return Ok(());
        }
    };
    for pool in &found {
        for d in &devices {
            if pool.devices.iter().any(|p| p == *d) {
                match &pool.in_use_by {
                    Some(holder) => bail!(
                        "{} is part of active pool '{}' ({holder})",
                        d.display(),
                        pool.name
                    ),
                    None => bail!(
                        "{} is part of {} pool '{}' (import it, destroy it, or use -f to overwrite)",
                        d.display(),
                        if pool.active {
                            "potentially active"
                        } else {
                            "exported"
                        },
                        pool.name
                    ),
                }
            }
        }
    }
    Ok(())
}

/// `pool list -o` columns: zpool's, then ours. size/alloc/free are raw
/// (raidz parity included, a mirror counted once) as zpool's; the usable
/// figures are `cistern list POOL`'s (and `usable`/`avail` here).
const POOL_COLUMNS: &[&str] = &[
    "name", "size", "alloc", "free", "ckpoint", "expandsz", "frag", "cap", "dedup", "health",
    "altroot", "guid", "txg", "usable", "avail", "physical",
];

/// What `pool list` shows without -o (zpool's default columns).
const POOL_DEFAULT_COLUMNS: &[&str] = &[
    "name", "size", "alloc", "free", "ckpoint", "expandsz", "frag", "cap", "dedup", "health",
    "altroot",
];

fn pool_column(c: &str) -> Option<&'static str> {
    let c = c.to_ascii_lowercase();
    let c = match c.as_str() {
        "allocated" => "alloc",
        "capacity" => "cap",
        "checkpoint" => "ckpoint",
        "fragmentation" => "frag",
        "dedupratio" => "dedup",
        other => POOL_COLUMNS.iter().copied().find(|k| *k == other)?,
    };
    Some(c)
}

fn pool_cell(p: &PoolSummary, col: &str, parsable: bool) -> String {
    let size = |n: u64| size_cell(n, parsable);
    // Summaries of older daemons carry no raw figures: the usable ones then.
    let (raw, raw_alloc) = if p.raw_size == 0 {
        (p.size, p.allocated)
    } else {
        (p.raw_size, p.raw_allocated)
    };
    let pct = |n: u64| {
        if parsable {
            n.to_string()
        } else {
            format!("{n}%")
        }
    };
    match col {
        "name" => p.name.clone(),
        "size" => size(raw),
        "alloc" => size(raw_alloc),
        "free" => size(raw.saturating_sub(raw_alloc)),
        "usable" => size(p.size),
        "avail" => size(p.free),
        "ckpoint" | "expandsz" | "altroot" => "-".into(),
        "frag" => p.fragmentation.map_or("-".into(), |f| pct(f as u64)),
        "dedup" => {
            if parsable {
                "1.00".into()
            } else {
                "1.00x".into()
            }
        }
        "cap" => {
            let pct = if raw == 0 {
                0
            } else {
                (raw_alloc as u128 * 100 / raw as u128) as u64
            };
            if parsable {
                pct.to_string()
            } else {
                format!("{pct}%")
            }
        }
        "health" => p.health.clone(),
        "guid" => p.guid.to_string(),
        "txg" => p.txg.to_string(),
        // The bucket's bytes (pools in a bucket, decision 0049).
        "physical" => p
            .bucket
            .as_ref()
            .and_then(|b| b.physical_bytes)
            .map_or("-".into(), size),
        _ => "-".into(),
    }
}

/// The `pool list` table.
pub fn pool_table(pools: &[PoolSummary], columns: &[&str], parsable: bool) -> Table {
    let mut t = Table::new(columns);
    for (i, c) in columns.iter().enumerate() {
        if matches!(
            *c,
            "size"
                | "alloc"
                | "free"
                | "cap"
                | "txg"
                | "frag"
                | "usable"
                | "avail"
                | "dedup"
                | "physical"
        ) {
            t.align_right(i);
        }
    }
    for p in pools {
        t.push(columns.iter().map(|c| pool_cell(p, c, parsable)).collect());
    }
    t
}

fn list(client: &api::Client, a: ListArgs) -> Result<()> {
    let columns: Vec<&str> = match &a.columns {
        None => POOL_DEFAULT_COLUMNS.to_vec(),
        Some(s) => split_list(s)
            .iter()
            .map(|c| {
                pool_column(c).with_context(|| {
                    format!("unknown column '{c}' (valid: {})", POOL_COLUMNS.join(", "))
                })
            })
            .collect::<Result<_>>()?,
    };
    let mut pools = client.list_pools()?;
    if !a.pools.is_empty() {
        for name in &a.pools {
            if !pools.iter().any(|p| &p.name == name) {
                bail!("{name} does not exist");
            }
        }
        pools.retain(|p| a.pools.contains(&p.name));
    }
    pools.sort_by(|x, y| x.name.cmp(&y.name));
    if a.format.json {
        return json(&pools);
    }
    if pools.is_empty() && !a.format.scripted {
        outln("no pools available");
        return Ok(());
    }
    out(&pool_table(&pools, &columns, a.format.parsable).render(a.format.scripted));
    Ok(())
}

fn status(client: &api::Client, a: StatusArgs) -> Result<()> {
    let statuses = match &a.pool {
        Some(p) => vec![client.pool_status(p)?],
        None => {
            let mut names: Vec<String> = client.list_pools()?.into_iter().map(|p| p.name).collect();
            names.sort();
            let mut v = Vec::new();
            for n in names {
                match client.pool_status(&n) {
                    Ok(s) => v.push(s),
                    // Exported or destroyed between the two calls.
                    Err(e) if e.kind() == Some("NotFound") => {}
                    Err(e) => return Err(e.into()),
                }
            }
            v
        }
    };
    if a.json {
        return json(&status_json(&statuses));
    }
    if statuses.is_empty() {
        outln("no pools available");
        return Ok(());
    }
    let statuses: Vec<PoolStatus> = if a.unhealthy {
        statuses
            .into_iter()
            .filter(|s| s.status.is_some())
            .collect()
    } else {
        statuses
    };
    if statuses.is_empty() {
        match &a.pool {
            Some(p) => outln(&format!("pool '{p}' is healthy")),
            None => outln("all pools are healthy"),
        }
        return Ok(());
    }
    let text: Vec<String> = statuses
        .iter()
        .map(|s| render_status_with(s, a.verbose, now_secs()))
        .collect();
    out(&text.join("\n"));
    Ok(())
}

/// Version of the `pool status --json` document (see the README's schema).
pub const STATUS_JSON_VERSION: u32 = 1;

/// `pool status --json`, one shape whatever is asked: as `zpool status -j`,
/// `{"output_version": 1, "pools": {"NAME": PoolStatus, ...}}`.
pub fn status_json(statuses: &[PoolStatus]) -> serde_json::Value {
    let pools: serde_json::Map<String, serde_json::Value> = statuses
        .iter()
        .map(|s| {
            (
                s.summary.name.clone(),
                serde_json::to_value(s).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    serde_json::json!({ "output_version": STATUS_JSON_VERSION, "pools": pools })
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `HH:MM:SS` (hours grow past 99 as needed), as zpool prints durations.
fn hms(secs: u64) -> String {
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The `scan:` lines of `pool status`, zpool style.
pub fn render_scan(scan: &ScanStatus, now: u64) -> String {
    let time = dataset::props::format_time;
    let (noun, done_verb) = match scan.function {
        ScanFunction::Scrub => ("scrub", "scrub repaired"),
        ScanFunction::Resilver => ("resilver", "resilvered"),
    };
    match scan.state {
        ScanState::Finished => format!(
            "  scan: {done_verb} {} in {} with {} errors on {}\n",
            human_size(scan.repaired),
            hms(scan.end_time.saturating_sub(scan.start_time)),
            scan.errors,
            time(scan.end_time)
        ),
        ScanState::Canceled => format!(
            "  scan: {noun} canceled on {} ({} of {} examined, {} repaired, {} errors)\n",
            time(scan.end_time),
            human_size(scan.examined),
            human_size(scan.total),
            human_size(scan.repaired),
            scan.errors
        ),
        ScanState::Scanning | ScanState::Paused => {
            let pct = if scan.total == 0 {
                0.0
            } else {
                scan.examined as f64 * 100.0 / scan.total as f64
            };
            let head = if scan.state == ScanState::Paused {
                format!("  scan: {noun} paused since {}\n", time(scan.start_time))
            } else {
                format!(
                    "  scan: {noun} in progress since {}\n",
                    time(scan.start_time)
                )
            };
            let tail = match (scan.state, scan.eta_secs) {
                (ScanState::Paused, _) => "paused".to_string(),
                (_, Some(eta)) => format!("{} to go", hms(eta)),
                (_, None) => "no estimated completion time".to_string(),
            };
            let target = scan
                .target
                .as_ref()
                .map(|t| format!(" onto {}", t.display()))
                .unwrap_or_default();
            let _ = now;
            format!(
                "{head}\t{} / {} scanned at {}/s, {} {}{target}, {} errors, {pct:.2}% done, {tail}\n",
                human_size(scan.examined),
                human_size(scan.total.max(scan.examined)),
                human_size(scan.rate),
                human_size(scan.repaired),
                if scan.function == ScanFunction::Resilver { "resilvered" } else { "repaired" },
                scan.errors,
            )
        }
    }
}

/// A device's name in `pool status`: its path, or for a missing device its
/// guid (the path it had follows the counters: `was /srv/d1`), as zpool.
fn device_name(d: &dataset::DeviceStatus) -> String {
    let path = d.path.display().to_string();
    if d.was.is_some() || path.starts_with("(missing device") {
        d.guid.to_string()
    } else {
        path
    }
}

/// zpool-status-style text for one pool; `verbose` lists unrepaired blocks.
pub fn render_status_with(s: &PoolStatus, verbose: bool, now: u64) -> String {
    let mut rows: Vec<(String, &str, [u64; 3])> = Vec::new();
    // (row, why a device is FAULTED/REMOVED/UNAVAIL), shown after its counters.
    let mut notes: Vec<(usize, Option<String>)> = Vec::new();
    let sum = |gs: &[GroupStatus]| {
        let mut c = [0u64; 3];
        for g in gs {
            for d in &g.devices {
                c[0] += d.read_errors;
                c[1] += d.write_errors;
                c[2] += d.checksum_errors;
            }
        }
        c
    };
    rows.push((s.summary.name.clone(), &s.summary.health, sum(&s.groups)));
    for g in &s.groups {
        if g.kind == GroupKind::Disk && g.devices.len() == 1 {
            let d = &g.devices[0];
            rows.push((
                format!("  {}", device_name(d)),
                &d.state,
                [d.read_errors, d.write_errors, d.checksum_errors],
            ));
            notes.push((rows.len() - 1, d.reason.clone().filter(|_| d.was.is_none())));
        } else {
            rows.push((
                format!("  {}", g.name),
                &g.state,
                sum(std::slice::from_ref(g)),
            ));
            for d in &g.devices {
                rows.push((
                    format!(
                        "    {}{}",
                        device_name(d),
                        if d.resilvering { "  (resilvering)" } else { "" }
                    ),
                    &d.state,
                    [d.read_errors, d.write_errors, d.checksum_errors],
                ));
                notes.push((rows.len() - 1, d.reason.clone().filter(|_| d.was.is_none())));
            }
        }
    }
    // Log devices follow under a "logs" row without counters, as zpool status shows them.
    let log_start = rows.len();
    for g in &s.logs {
        if g.kind == GroupKind::Log && g.devices.len() == 1 {
            let d = &g.devices[0];
            rows.push((
                format!("  {}", device_name(d)),
                &d.state,
                [d.read_errors, d.write_errors, d.checksum_errors],
            ));
            notes.push((rows.len() - 1, d.reason.clone()));
        } else {
            rows.push((
                format!("  {}", g.name),
                &g.state,
                sum(std::slice::from_ref(g)),
            ));
            for d in &g.devices {
                rows.push((
                    format!("    {}", device_name(d)),
                    &d.state,
                    [d.read_errors, d.write_errors, d.checksum_errors],
                ));
                notes.push((rows.len() - 1, d.reason.clone()));
            }
        }
    }
    let mut t = Table::new(&["NAME", "STATE", "READ", "WRITE", "CKSUM"]);
    for i in 2..5 {
        t.align_right(i);
    }
    let any_note = notes.iter().any(|n| n.1.is_some());
    if any_note {
        t = Table::new(&["NAME", "STATE", "READ", "WRITE", "CKSUM", ""]);
        for i in 2..5 {
            t.align_right(i);
        }
    }
    for (i, (name, state, c)) in rows.into_iter().enumerate() {
        if i == log_start && !s.logs.is_empty() {
            let mut row = vec!["logs".to_string()];
            row.resize(if any_note { 6 } else { 5 }, String::new());
            t.push(row);
        }
        let mut row = vec![
            name,
            state.to_string(),
            c[0].to_string(),
            c[1].to_string(),
            c[2].to_string(),
        ];
        if any_note {
            let note = notes.iter().find(|n| n.0 == i).and_then(|n| n.1.clone());
            row.push(note.unwrap_or_default());
        }
        t.push(row);
    }
    let mut o = String::new();
    o.push_str(&format!("  pool: {}\n", s.summary.name));
    o.push_str(&format!(" state: {}\n", s.summary.health));
    if let Some(st) = &s.status {
        o.push_str(&format!("status: {st}\n"));
    }
    if let Some(act) = &s.action {
        o.push_str(&format!("action: {act}\n"));
    }
    o.push_str(&format!("   txg: {}\n", s.summary.txg));
    if let Some(b) = &s.summary.bucket {
        o.push_str(&format!(
            "bucket: {} physical ({} log objects, {} segments of {}), {} checkpoints, {} deleted\n",
            b.physical_bytes.map_or("-".into(), human_size),
            b.log_objects,
            b.segment_objects,
            human_size(b.segment_bytes),
            b.checkpoints,
            human_size(b.deleted_bytes)
        ));
        if let Some(c) = &b.cache {
            let reads = (c.hits + c.misses).max(1);
            o.push_str(&format!(
                " cache: {} of {} held, {:.1}% hits ({} hits, {} misses), {} fetched, {} lines evicted\n",
                human_size(c.held_bytes),
                human_size(c.bound_bytes),
                c.hits as f64 * 100.0 / reads as f64,
                c.hits,
                c.misses,
                human_size(c.fetched_bytes),
                c.evicted_lines
            ));
        }
    }
    if let (true, Some(m)) = (verbose, &s.memory) {
        let a = &m.arc;
        let reads = (a.hits + a.misses).max(1);
        o.push_str(&format!(
            "   arc: {} of {} (min {}, max {}), {:.1}% hits ({} hits, {} misses), {} prefetched\n",
            human_size(a.size),
            human_size(a.target),
            human_size(a.min),
            human_size(a.max),
            a.hits as f64 * 100.0 / reads as f64,
            a.hits,
            a.misses,
            a.prefetch_reads
        ));
    }
    if let Some(scan) = &s.scan {
        o.push_str(&render_scan(scan, now));
    }
    o.push_str("config:\n\n");
    // A missing device's old path trails its row, as zpool's `was /path`.
    let notes: Vec<Option<String>> = std::iter::once(None)
        .chain(s.groups.iter().flat_map(|g| {
            let own = g.kind == GroupKind::Disk && g.devices.len() == 1;
            let devs = g
                .devices
                .iter()
                .map(|d| d.was.as_ref().map(|w| format!("  was {}", w.display())));
            (!own).then_some(None).into_iter().chain(devs)
        }))
        .collect();
    for (i, line) in t.render(false).lines().enumerate() {
        o.push('\t');
        o.push_str(line);
        if let Some(Some(note)) = i.checked_sub(1).and_then(|r| notes.get(r)) {
            o.push_str(note);
        }
        o.push('\n');
    }
    // L2ARC devices, as zpool's "cache" section (READ/WRITE/CKSUM: read
    // failures are not kept apart; CKSUM counts records that failed their hash).
    if !s.cache.is_empty() {
        o.push_str("\tcache\n");
        for c in &s.cache {
            o.push_str(&format!(
                "\t  {}  {}  0 0 {}  ({} of {}, {} hits, {} misses)\n",
                c.path.display(),
                c.state,
                c.checksum_errors,
                human_size(c.size),
                human_size(c.capacity),
                c.hits,
                c.misses
            ));
        }
    }
    o.push('\n');
    if verbose && !s.data_errors.is_empty() {
        o.push_str("errors: Permanent errors have been detected in the following datasets:\n\n");
        for e in &s.data_errors {
            o.push_str(&format!(
                "        {} @ offset {} ({} bytes)\n",
                e.dataset, e.offset, e.length
            ));
        }
    } else if s.errors.is_empty() {
        o.push_str("errors: No known data errors\n");
    } else {
        for e in &s.errors {
            if e.starts_with("errors:") {
                o.push_str(e);
            } else {
                o.push_str("errors: ");
                o.push_str(e);
            }
            o.push('\n');
        }
    }
    o
}

fn import(client: &api::Client, a: ImportArgs) -> Result<()> {
    let cwd = cwd()?;
    let dirs: Vec<PathBuf> = if a.dirs.is_empty() {
        vec![cwd.clone()]
    } else {
        a.dirs.iter().map(|d| absolute(d, &cwd)).collect()
    };
    match a.pool {
        Some(pool) => {
            client.import_pool_with(&pool, &dirs, a.force, a.missing_log)?;
            Ok(())
        }
        None => {
            let found = client.importable_pools(&dirs)?;
            if a.json {
                return json(&found);
            }
            if found.is_empty() {
                let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                outln(&format!(
                    "no pools available to import in {}",
                    list.join(", ")
                ));
                return Ok(());
            }
            let text: Vec<String> = found.iter().map(|p| render_importable(p, &dirs)).collect();
            out(&text.join("\n"));
            Ok(())
        }
    }
}

fn render_importable(p: &ImportablePool, dirs: &[PathBuf]) -> String {
    let dir_args: String = dirs
        .iter()
        .map(|d| format!("-d {} ", d.display()))
        .collect();
    let mut o = String::new();
    o.push_str(&format!("   pool: {}\n", p.name));
    o.push_str(&format!("     id: {}\n", p.guid));
    o.push_str(&format!(
        "  state: {}\n",
        if p.complete {
            "ONLINE"
        } else {
            "UNAVAIL (devices missing)"
        }
    ));
    let force = match &p.in_use_by {
        Some(holder) => {
            o.push_str(&format!(
                " status: The pool may be active on another system ({holder}).\n"
            ));
            "-f "
        }
        None => "",
    };
    o.push_str(&format!(
        " action: cistern pool import {force}{dir_args}{}\n",
        p.name
    ));
    o.push_str(" config:\n\n");
    for d in &p.devices {
        o.push_str(&format!("\t{}\n", d.display()));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataset::DeviceStatus;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn spec(s: &str) -> Result<Vec<GroupSpec>> {
        parse_vdev_spec(&words(s), Path::new("/work"))
    }

    #[test]
    fn log_groups() {
        let g = spec("a b log c").unwrap();
        assert_eq!(
            g.iter().map(|g| g.kind).collect::<Vec<_>>(),
            vec![GroupKind::Disk, GroupKind::Disk, GroupKind::Log]
        );
        let g = spec("mirror a b log mirror c d").unwrap();
        assert_eq!(g[1].kind, GroupKind::LogMirror);
        assert_eq!(g[1].devices.len(), 2);
        assert!(spec("a log").is_err());
        assert!(spec("a log raidz1 b c d").is_err());
        assert!(spec("a log mirror c").is_err());
        assert!(spec("a log b log c").is_err());
    }

    #[test]
    fn single_device_and_stripe() {
        let g = spec("d0").unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].kind, GroupKind::Disk);
        assert_eq!(g[0].devices, vec![PathBuf::from("/work/d0")]);
        let g = spec("/dev/sdb ./d1 ../x/d2").unwrap();
        assert_eq!(g.len(), 3);
        assert!(g
            .iter()
            .all(|g| g.kind == GroupKind::Disk && g.devices.len() == 1));
        assert_eq!(g[0].devices[0], PathBuf::from("/dev/sdb"));
        assert_eq!(g[1].devices[0], PathBuf::from("/work/d1"));
        assert_eq!(g[2].devices[0], PathBuf::from("/work/../x/d2"));
    }

    #[test]
    fn mirrors() {
        let g = spec("mirror a b").unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].kind, GroupKind::Mirror);
        assert_eq!(g[0].devices.len(), 2);
        let g = spec("mirror a b c mirror d e").unwrap();
        assert_eq!(
            g.iter().map(|g| g.devices.len()).collect::<Vec<_>>(),
            vec![3, 2]
        );
        // Bare devices before a mirror are their own groups.
        let g = spec("x mirror a b").unwrap();
        assert_eq!(g[0].kind, GroupKind::Disk);
        assert_eq!(g[1].kind, GroupKind::Mirror);
    }

    #[test]
    fn bad_specs() {
        assert!(spec("").unwrap_err().to_string().contains("no devices"));
        assert!(spec("mirror a")
            .unwrap_err()
            .to_string()
            .contains("at least 2"));
        assert!(spec("mirror")
            .unwrap_err()
            .to_string()
            .contains("at least 2"));
        assert!(spec("mirror a b mirror").is_err());
        assert!(spec("a ./a")
            .unwrap_err()
            .to_string()
            .contains("more than once"));
        assert!(spec("draid a b c")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        assert!(spec("raidz3 a b c")
            .unwrap_err()
            .to_string()
            .contains("at least 4"));
    }

    #[test]
    fn raidz_groups() {
        let g = spec("raidz2 a b c d raidz2 e f g h").unwrap();
        assert_eq!(g.len(), 2);
        assert!(g
            .iter()
            .all(|g| g.kind == GroupKind::Raidz2 && g.devices.len() == 4));
        let g = spec("raidz a b mirror c d raidz3 e f g h").unwrap();
        assert_eq!(
            g.iter().map(|g| g.kind).collect::<Vec<_>>(),
            vec![GroupKind::Raidz1, GroupKind::Mirror, GroupKind::Raidz3]
        );
    }

    fn summary(name: &str, size: u64, alloc: u64) -> PoolSummary {
        PoolSummary {
            name: name.into(),
            guid: 42,
            size,
            allocated: alloc,
            free: size - alloc,
            health: "ONLINE".into(),
            txg: 9,
            raw_size: 0,
            raw_allocated: 0,
            fragmentation: None,
            bucket: None,
        }
    }

    #[test]
    fn pool_list_table() {
        let pools = vec![summary("tank", 8 << 30, 2 << 30)];
        let cols = ["name", "size", "alloc", "free", "cap", "health"];
        assert_eq!(
            pool_table(&pools, &cols, false).render(false),
            "NAME  SIZE  ALLOC  FREE  CAP  HEALTH\ntank    8G     2G    6G  25%  ONLINE\n"
        );
        assert_eq!(
            pool_table(&pools, &cols, true).render(true),
            format!(
                "tank\t{}\t{}\t{}\t25\tONLINE\n",
                8u64 << 30,
                2u64 << 30,
                6u64 << 30
            )
        );
        assert_eq!(pool_column("capacity"), Some("cap"));
        assert_eq!(pool_column("bogus"), None);
    }

    #[test]
    fn history_and_event_text_as_zpool() {
        let rec = |command: &str, internal: bool| dataset::HistoryRecord {
            time: 1_795_459_373, // 2026-11-23 18:42:53 UTC
            command: command.into(),
            user: if internal { "".into() } else { "root".into() },
            host: if internal { "".into() } else { "vm".into() },
            internal,
            txg: 7,
        };
        let recs = [
            rec("create pool format 2", true),
            rec("cistern pool create tank d0", false),
        ];
        assert_eq!(
            render_history("tank", &recs, false, false),
            "History for 'tank':\n2026-11-23.18:42:53 cistern pool create tank d0\n"
        );
        assert_eq!(
            render_history("tank", &recs, true, true),
            "History for 'tank':\n2026-11-23.18:42:53 [txg:7] create pool format 2\n\
             2026-11-23.18:42:53 cistern pool create tank d0 [user root on vm]\n"
        );
        let ev = dataset::Event {
            seq: 3,
            time: 1_795_459_373,
            nanos: 5,
            class: "ereport.fs.cistern.checksum".into(),
            pool: "tank".into(),
            pool_guid: 255,
            fields: [("vdev_path".to_string(), "/d/b".to_string())].into(),
        };
        assert_eq!(
            render_event(&ev, false, false),
            "Nov 23 2026 18:42:53.000000005 ereport.fs.cistern.checksum\n"
        );
        assert_eq!(
            render_event(&ev, false, true),
            "Nov 23 2026 18:42:53.000000005\tereport.fs.cistern.checksum\n"
        );
        assert!(render_event(&ev, true, false).contains("        vdev_path = \"/d/b\"\n"));
    }

    #[test]
    fn missing_device_shows_its_guid_and_old_path() {
        let mut s = PoolStatus {
            memory: None,
            cache: vec![],
            summary: summary("tank", 8 << 30, 0),
            logs: vec![],
            groups: vec![GroupStatus {
                name: "mirror-0".into(),
                kind: GroupKind::Mirror,
                state: "DEGRADED".into(),
                devices: vec![
                    DeviceStatus {
                        path: "/d/a".into(),
                        guid: 1,
                        state: "ONLINE".into(),
                        read_errors: 0,
                        write_errors: 0,
                        checksum_errors: 0,
                        resilvering: false,
                        was: None,
                        reason: None,
                    },
                    DeviceStatus {
                        path: "(missing device 99)".into(),
                        guid: 99,
                        state: "UNAVAIL".into(),
                        read_errors: 0,
                        write_errors: 0,
                        checksum_errors: 0,
                        resilvering: false,
                        was: Some("/d/b".into()),
                        reason: Some("cannot open".into()),
                    },
                ],
            }],
            errors: vec![],
            scan: None,
            data_errors: vec![],
            status: None,
            action: None,
            suspended: None,
        };
        s.summary.health = "DEGRADED".into();
        let text = render_status_with(&s, false, 0);
        assert!(
            text.contains("\t    99      UNAVAIL      0      0      0  was /d/b\n"),
            "{text}"
        );
        assert!(
            text.contains("\t    /d/a    ONLINE       0      0      0\n"),
            "{text}"
        );
        let doc = status_json(std::slice::from_ref(&s));
        assert_eq!(doc["output_version"], 1);
        assert_eq!(
            doc["pools"]["tank"]["groups"][0]["devices"][1]["was"],
            "/d/b"
        );
    }

    #[test]
    fn status_tree() {
        let dev = |p: &str, cksum| DeviceStatus {
            path: p.into(),
            guid: 1,
            state: "ONLINE".into(),
            read_errors: 0,
            write_errors: 0,
            checksum_errors: cksum,
            resilvering: false,
            was: None,
            reason: None,
        };
        let s = PoolStatus {
            memory: None,
            cache: vec![],
            summary: summary("tank", 8 << 30, 0),
            logs: vec![],
            groups: vec![
                GroupStatus {
                    name: "mirror-0".into(),
                    kind: GroupKind::Mirror,
                    state: "ONLINE".into(),
                    devices: vec![dev("/d/a", 1), dev("/d/b", 2)],
                },
                GroupStatus {
                    name: "/d/c".into(),
                    kind: GroupKind::Disk,
                    state: "ONLINE".into(),
                    devices: vec![dev("/d/c", 0)],
                },
            ],
            errors: vec![],
            scan: None,
            data_errors: vec![],
            status: None,
            action: None,
            suspended: None,
        };
        let text = render_status_with(&s, false, 0);
        let expected = "  pool: tank\n state: ONLINE\n   txg: 9\nconfig:\n\n\
            \tNAME        STATE   READ  WRITE  CKSUM\n\
            \ttank        ONLINE     0      0      3\n\
            \t  mirror-0  ONLINE     0      0      3\n\
            \t    /d/a    ONLINE     0      0      1\n\
            \t    /d/b    ONLINE     0      0      2\n\
            \t  /d/c      ONLINE     0      0      0\n\
            \nerrors: No known data errors\n";
        assert_eq!(text, expected);
        // A faulted device: status and action lines, its reason after the counters.
        let mut s = s;
        s.summary.health = "DEGRADED".into();
        s.groups[0].state = "DEGRADED".into();
        s.groups[0].devices[1].state = "FAULTED".into();
        s.groups[0].devices[1].reason = Some("too many errors".into());
        s.status = Some("One or more devices are faulted.".into());
        s.action = Some("Replace the faulted device.".into());
        let text = render_status_with(&s, false, 0);
        assert!(text.contains(" state: DEGRADED\nstatus: One or more devices are faulted.\naction: Replace the faulted device.\n"), "{text}");
        assert!(
            text.contains("/d/b    FAULTED      0      0      2  too many errors\n"),
            "{text}"
        );
        // Log devices follow under "logs", as zpool status shows them.
        s.logs = vec![GroupStatus {
            name: "mirror-2".into(),
            kind: GroupKind::LogMirror,
            state: "ONLINE".into(),
            devices: vec![dev("/d/l0", 0), dev("/d/l1", 0)],
        }];
        let text = render_status_with(&s, false, 0);
        let tail = text.split("/d/c").nth(1).unwrap_or_default();
        let names: Vec<&str> = tail
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap_or(""))
            .take(4)
            .collect();
        assert_eq!(names, ["logs", "mirror-2", "/d/l0", "/d/l1"], "{text}");
    }
}

#[derive(Debug, Args)]
pub struct PoolGetArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Fields: name,property,value,source.
    #[arg(short = 'o', value_name = "FIELDS")]
    pub fields: Option<String>,
    /// `all`, or properties separated by commas.
    #[arg(value_name = "all|PROP[,PROP...]")]
    pub props: String,
    /// Pools (default: all).
    pub pools: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PoolSetArgs {
    /// PROP=VALUE (failmode=wait|continue, autoreplace=on|off, comment=TEXT).
    #[arg(value_name = "PROP=VALUE")]
    pub assignment: String,
    pub pool: String,
}

fn pool_get(client: &api::Client, a: PoolGetArgs) -> Result<()> {
    use crate::cmd::dataset::{get_fields, get_table, GetRow};
    let fields = get_fields(&a.fields)?;
    let pools: Vec<String> = if a.pools.is_empty() {
        let mut names: Vec<String> = client.list_pools()?.into_iter().map(|p| p.name).collect();
        names.sort();
        names
    } else {
        a.pools.clone()
    };
    let wanted: Option<Vec<String>> = (a.props.trim() != "all").then(|| {
        split_list(&a.props)
            .iter()
            .map(|p| p.to_ascii_lowercase())
            .collect()
    });
    if wanted.as_ref().is_some_and(|w| w.is_empty()) {
        bail!("no property given");
    }
    let mut rows = Vec::new();
    for pool in &pools {
        let props = client.pool_properties(pool)?;
        let row = |p: &dataset::Property| GetRow {
            name: pool.clone(),
            property: p.name.clone(),
            value: p.value.clone(),
            parsable: p.parsable.clone(),
            source: p.source.clone(),
        };
        match &wanted {
            None => rows.extend(props.iter().map(row)),
            Some(w) => {
                for name in w {
                    match props.iter().find(|p| &p.name == name) {
                        Some(p) => rows.push(row(p)),
                        None => bail!(
                            "bad property list: invalid property '{name}' (valid: {})",
                            props
                                .iter()
                                .map(|p| p.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                }
            }
        }
    }
    if a.format.json {
        return json(&rows);
    }
    out(&get_table(&rows, &fields, a.format.parsable).render(a.format.scripted));
    Ok(())
}

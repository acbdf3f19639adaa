//! `cistern replication add|list|status|run|remove|pause|resume`: jobs that
//! copy a dataset's snapshots to (push) or from (pull) another Cistern
//! daemon (crates/replication).

use crate::cmd::OutputFlags;
use crate::format::{size_cell, Table};
use crate::output::{json, out, outln};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use replication::{AddJob, JobConfig, JobStatus, RunRecord, RunRequest};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum ReplicationCommand {
    /// Add a job: --source DATASET --target https://HOST:PORT/POOL/DS (push), or the reverse with --pull.
    Add(AddArgs),
    /// The jobs, their state and last common snapshot.
    List(ListArgs),
    /// A job's (or every job's) state, transfer progress and recent runs.
    Status(ListArgs),
    /// Run a job now and wait for it (`--force`: roll back a changed target).
    Run(RunArgs),
    /// Remove a job added with `add` (its holds are released).
    Remove(NameArg),
    /// No more scheduled runs until `resume` (`run` still works).
    Pause(NameArg),
    Resume(NameArg),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    pub name: String,
    /// A dataset here, or the other daemon's https://HOST:PORT/POOL/DATASET (with --pull).
    #[arg(long)]
    pub source: String,
    /// The other daemon's https://HOST:PORT/POOL/DATASET, or a dataset here (with --pull).
    #[arg(long)]
    pub target: String,
    /// This daemon fetches from the source (which must be a URL).
    #[arg(long)]
    pub pull: bool,
    /// Snapshot policy whose retention grid prunes the target.
    #[arg(long)]
    pub policy: Option<String>,
    /// Snapshot policy whose retention grid prunes the source.
    #[arg(long)]
    pub source_policy: Option<String>,
    /// An interval between runs: 30s, 10m, 1h.
    #[arg(long, conflicts_with = "after_snapshot")]
    pub schedule: Option<String>,
    /// Run after every automatic snapshot of the source (push jobs).
    #[arg(long)]
    pub after_snapshot: bool,
    /// Bandwidth limit in bytes per second (10M, 512K).
    #[arg(long)]
    pub bwlimit: Option<String>,
    /// PEM CA the other daemon's certificate must chain to (the global --ca is this daemon's).
    #[arg(long, value_name = "FILE")]
    pub remote_ca: Option<PathBuf>,
    /// File with the other daemon's API token (its STATE_DIR/api.token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Allow plain http:// to a host other than 127.0.0.1.
    #[arg(long)]
    pub insecure: bool,
    /// Seconds before the first retry after a failure (doubling up to 1 h).
    #[arg(long, value_name = "SECS")]
    pub retry: Option<f64>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Columns (name,direction,source,target,schedule,state,common,last_success,failures,sent,progress,rate,eta,error).
    #[arg(short = 'o', value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Only this job.
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Roll back (or replace) a target changed since the last common snapshot.
    #[arg(long, short = 'F')]
    pub force: bool,
    /// Start it and return at once.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the run as JSON.
    #[arg(long)]
    pub json: bool,
    pub name: String,
}

#[derive(Debug, Args)]
pub struct NameArg {
    pub name: String,
}

pub fn run(client: &api::Client, c: ReplicationCommand) -> Result<()> {
    match c {
        ReplicationCommand::Add(a) => add(client, a),
        ReplicationCommand::List(a) => list(client, a, false),
        ReplicationCommand::Status(a) => list(client, a, true),
        ReplicationCommand::Run(a) => run_now(client, a),
        ReplicationCommand::Remove(a) => remove(client, a),
        ReplicationCommand::Pause(a) => pause(client, a, true),
        ReplicationCommand::Resume(a) => pause(client, a, false),
    }
}

fn job_path(name: &str, suffix: &str) -> String {
    let enc: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("/v1/replication/{enc}{suffix}")
}

fn add(client: &api::Client, a: AddArgs) -> Result<()> {
    let schedule = if a.after_snapshot {
        Some("after-snapshot".to_string())
    } else {
        a.schedule
    };
    let body = AddJob {
        job: a.name,
        config: JobConfig {
            source: a.source,
            target: a.target,
            pull: a.pull,
            policy: a.policy,
            source_policy: a.source_policy,
            schedule,
            bwlimit: a.bwlimit,
            ca: a.remote_ca.map(absolute),
            token_file: a.token_file.map(absolute),
            insecure: a.insecure,
            retry_secs: a.retry,
        },
    };
    let s: JobStatus = client.post_json("/v1/replication", &[], &body)?;
    outln(&format!(
        "replication job '{}' added: {} {} -> {} ({})",
        s.name,
        dir(&s),
        s.source,
        s.target,
        s.schedule
    ));
    Ok(())
}

/// The daemon reads these files: make them absolute here.
fn absolute(p: PathBuf) -> PathBuf {
    std::path::absolute(&p).unwrap_or(p)
}

fn dir(s: &JobStatus) -> &'static str {
    match s.direction {
        replication::Direction::Push => "push",
        replication::Direction::Pull => "pull",
    }
}

fn time(t: Option<i64>) -> String {
    match t {
        Some(t) if t > 0 => dataset::policy::time::display(t),
        _ => "-".into(),
    }
}

fn dash(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into())
}

fn cell(s: &JobStatus, col: &str, parsable: bool) -> Result<String> {
    let p = s.progress.as_ref();
    Ok(match col {
        "name" => s.name.clone(),
        "direction" => dir(s).into(),
        "source" => s.source.clone(),
        "target" => s.target.clone(),
        "schedule" => s.schedule.clone(),
        "policy" => dash(s.policy.clone()),
        "source_policy" => dash(s.source_policy.clone()),
        "bwlimit" => s
            .bwlimit
            .map_or("-".into(), |b| format!("{}/s", size_cell(b, parsable))),
        "origin" => s.origin.clone(),
        "state" => s.state.clone(),
        "common" => dash(s.last_common.clone().map(|c| format!("@{c}"))),
        "last_success" => match parsable {
            true => s.last_success.unwrap_or(0).to_string(),
            false => time(s.last_success),
        },
        "next_run" => match parsable {
            true => s.next_run.unwrap_or(0).to_string(),
            false => time(s.next_run),
        },
        "failures" => s.failures.to_string(),
        "sent" => size_cell(s.bytes_total, parsable),
        "progress" => match p {
            Some(p) if p.total > 0 => format!(
                "{}/{}",
                size_cell(p.bytes, parsable),
                size_cell(p.total, parsable)
            ),
            Some(p) => size_cell(p.bytes, parsable),
            None => "-".into(),
        },
        "rate" => p.map_or("-".into(), |p| {
            format!("{}/s", size_cell(p.rate as u64, parsable))
        }),
        "eta" => p
            .and_then(|p| p.eta_secs)
            .map_or("-".into(), |e| match parsable {
                true => e.to_string(),
                false => format!("{}:{:02}:{:02}", e / 3600, e / 60 % 60, e % 60),
            }),
        "error" => dash(s.last_error.clone()),
        other => bail!(
            "unknown column '{other}' (name, direction, source, target, schedule, policy, source_policy, bwlimit, origin, state, common, last_success, next_run, failures, sent, progress, rate, eta, error)"
        ),
    })
}

fn list(client: &api::Client, a: ListArgs, detailed: bool) -> Result<()> {
    let jobs: Vec<JobStatus> = match &a.name {
        Some(n) => vec![client.get_json(&job_path(n, ""), &[])?],
        None => client.get_json("/v1/replication", &[])?,
    };
    if a.format.json {
        return match (&a.name, jobs.into_iter().next()) {
            (Some(_), Some(j)) => json(&j),
            (_, first) => json(&first.into_iter().collect::<Vec<_>>()),
        };
    }
    let default: &[&str] = if detailed {
        &[
            "name",
            "state",
            "common",
            "last_success",
            "sent",
            "progress",
            "rate",
            "eta",
            "error",
        ]
    } else {
        &[
            "name",
            "direction",
            "source",
            "target",
            "schedule",
            "state",
            "common",
        ]
    };
    let cols: Vec<String> = if a.columns.is_empty() {
        default.iter().map(|s| s.to_string()).collect()
    } else {
        a.columns.clone()
    };
    let mut t = Table::new(&cols.iter().map(|c| c.to_uppercase()).collect::<Vec<_>>());
    for j in &jobs {
        let row = cols
            .iter()
            .map(|c| cell(j, c, a.format.parsable))
            .collect::<Result<Vec<_>>>()?;
        t.push(row);
    }
    out(&t.render(a.format.scripted));
    // `status NAME`: the recent runs too.
    if detailed && a.name.is_some() && !a.format.scripted {
        if let Some(j) = jobs.first() {
            if !j.history.is_empty() {
                outln("");
                outln("recent runs:");
                for r in j.history.iter().rev().take(10) {
                    outln(&format!("  {}", run_line(r)));
                }
            }
        }
    }
    Ok(())
}

fn run_line(r: &RunRecord) -> String {
    let mut s = format!(
        "{} {} ({}): {}",
        time(Some(r.start)),
        r.result,
        r.trigger,
        crate::format::human_size(r.bytes)
    );
    if !r.streams.is_empty() {
        s.push_str(&format!(", {}", r.streams.join(", ")));
    }
    if r.resumed {
        s.push_str(", resumed");
    }
    if !r.pruned_source.is_empty() || !r.pruned_target.is_empty() {
        s.push_str(&format!(
            ", pruned {} here/source and {} target",
            r.pruned_source.len(),
            r.pruned_target.len()
        ));
    }
    if let Some(e) = &r.error {
        s.push_str(&format!(": {e}"));
    }
    s
}

fn run_now(client: &api::Client, a: RunArgs) -> Result<()> {
    let body = RunRequest {
        force: a.force,
        no_wait: a.no_wait,
    };
    let path = job_path(&a.name, "/run");
    if a.no_wait {
        let _: serde_json::Value = client.post_json(&path, &[], &body)?;
        outln(&format!("replication job '{}' started", a.name));
        return Ok(());
    }
    // A run may stream for long: no bound on the call.
    let long = client.with_call_timeout(Duration::from_secs(7 * 24 * 3600));
    let r: RunRecord = long.post_json(&path, &[], &body)?;
    if a.json {
        return json(&r);
    }
    outln(&run_line(&r));
    for n in &r.notes {
        outln(&format!("note: {n}"));
    }
    Ok(())
}

fn remove(client: &api::Client, a: NameArg) -> Result<()> {
    let v: serde_json::Value = {
        let path = job_path(&a.name, "");
        client.delete_json(&path)?
    };
    if let Some(notes) = v.get("notes").and_then(|n| n.as_array()) {
        for n in notes.iter().filter_map(|n| n.as_str()) {
            outln(&format!("note: {n}"));
        }
    }
    Ok(())
}

fn pause(client: &api::Client, a: NameArg, paused: bool) -> Result<()> {
    let suffix = if paused { "/pause" } else { "/resume" };
    let _: JobStatus = client.post_json(&job_path(&a.name, suffix), &[], &serde_json::json!({}))?;
    Ok(())
}

//! `cistern policy list|show|run|history`: snapshot policies (see the
//! `policy` crate for the rules, `dataset::autosnap` for the scheduler).

use crate::cmd::OutputFlags;
use crate::format::{size_cell, Table};
use crate::output::{json, out, outln};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use dataset::policy::{time::display, Plan};
use dataset::PolicyRun;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// The named policies (config and built-in) and the datasets using each.
    List(ListArgs),
    /// Which policy applies to a dataset, from where, next run, what each rule keeps.
    Show(ShowArgs),
    /// Take a snapshot now and prune (`-n`: only say what and why).
    Run(RunArgs),
    /// What the policies did: snapshots taken, destroyed, failures.
    History(HistoryArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: OutputFlags,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// POOL/DS
    pub dataset: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Dry run: print what would be created and destroyed, and why.
    #[arg(short = 'n')]
    pub dry_run: bool,
    /// Exact numbers.
    #[arg(short = 'p')]
    pub parsable: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// POOL/DS
    pub dataset: String,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Only this dataset.
    pub dataset: Option<String>,
}

pub fn run(client: &api::Client, c: PolicyCommand) -> Result<()> {
    match c {
        PolicyCommand::List(a) => list(client, a),
        PolicyCommand::Show(a) => show(client, a),
        PolicyCommand::Run(a) => run_now(client, a),
        PolicyCommand::History(a) => history(client, a),
    }
}

/// `90s`, `10m`, `2h`: the shortest exact unit.
fn secs(n: i64) -> String {
    match n {
        n if n >= 3600 && n % 3600 == 0 => format!("{}h", n / 3600),
        n if n >= 60 && n % 60 == 0 => format!("{}m", n / 60),
        n => format!("{n}s"),
    }
}

fn dash(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into())
}

fn list(client: &api::Client, a: ListArgs) -> Result<()> {
    let rows = client.policies()?;
    if a.format.json {
        return json(&rows);
    }
    let mut t = Table::new(&[
        "NAME", "SCHEDULE", "KEEP", "PREFIX", "CAPACITY", "EVENTS", "SOURCE", "DATASETS",
    ]);
    for r in rows {
        let p = r.policy;
        t.push(vec![
            p.name,
            p.schedule,
            p.keep,
            p.prefix,
            dash(p.capacity_percent.map(|c| format!("{c}%"))),
            dash(Some(p.events.join(","))),
            p.origin,
            dash(Some(r.datasets.join(","))),
        ]);
    }
    out(&t.render(a.format.scripted));
    Ok(())
}

fn show(client: &api::Client, a: ShowArgs) -> Result<()> {
    let s = client.policy_show(&a.dataset)?;
    if a.json {
        return json(&s);
    }
    outln(&format!("dataset:    {}", s.dataset));
    let from = match (&s.property, &s.source) {
        (Some(p), Some(src)) => format!("{p} ({src})"),
        _ => "-".into(),
    };
    outln(&format!("property:   {from}"));
    if let Some(e) = &s.error {
        outln(&format!("error:      {e}"));
    }
    let Some(p) = &s.policy else {
        if s.error.is_none() {
            outln("policy:     none (set snapshot:policy=NAME or snapshot:schedule=hourly)");
        }
        return Ok(());
    };
    outln(&format!("policy:     {} ({})", p.name, p.origin));
    outln(&format!("schedule:   {}", p.schedule));
    outln(&format!("keep:       {}", p.keep));
    outln(&format!("prefix:     {}", p.prefix));
    if let Some(c) = p.capacity_percent {
        outln(&format!(
            "capacity:   {c}% (past it the oldest automatic snapshots go first)"
        ));
    }
    if !p.events.is_empty() {
        let quiet = if p.events.iter().any(|e| e == "s3-quiet") {
            format!("; s3-quiet after {}", secs(p.s3_quiet_secs))
        } else {
            String::new()
        };
        outln(&format!(
            "events:     {} (at most one snapshot per {}{quiet})",
            p.events.join(", "),
            secs(p.event_min_interval_secs)
        ));
    }
    for (what, hook) in [("pre-hook", &p.pre_hook), ("post-hook", &p.post_hook)] {
        if let Some(h) = hook {
            outln(&format!("{what}:   {h} (timeout {}s)", p.hook_timeout_secs));
        }
    }
    outln(&format!("last run:   {}", dash(s.last_run.map(display))));
    if let Some(plan) = &s.plan {
        outln(&format!("next run:   {}", dash(plan.next_run.map(display))));
        outln(&format!(
            "now:        {}",
            match &plan.create {
                Some(_) => format!("due ({})", plan.create_reason),
                None => plan.create_reason.clone(),
            }
        ));
        print_rules(plan);
        print_decisions(&s.dataset, plan, "", false);
    }
    Ok(())
}

/// What each retention rule keeps.
fn print_rules(plan: &Plan) {
    outln("rules:");
    for r in &plan.rules {
        outln(&format!(
            "  {:<14} keeps {:>4}: {}",
            r.rule,
            r.kept.len(),
            dash(Some(r.kept.join(" ")))
        ));
    }
}

/// `keep`/`destroy` lines, one per snapshot, with the rules behind each.
fn print_decisions(ds: &str, plan: &Plan, verb_prefix: &str, with_keep: bool) {
    if with_keep || verb_prefix.is_empty() {
        for k in &plan.keep {
            outln(&format!(
                "{verb_prefix}keep     {ds}@{}  {}",
                k.name,
                k.reasons.join("; ")
            ));
        }
    }
    for d in &plan.destroy {
        outln(&format!(
            "{verb_prefix}destroy  {ds}@{}  {}",
            d.name,
            d.reasons.join("; ")
        ));
    }
    if !plan.manual.is_empty() {
        outln(&format!(
            "{verb_prefix}ignore   {} manual snapshot(s), never pruned: {}",
            plan.manual.len(),
            plan.manual.join(" ")
        ));
    }
}

fn run_now(client: &api::Client, a: RunArgs) -> Result<()> {
    let r = client.policy_run(&a.dataset, a.dry_run)?;
    if a.json {
        return json(&r);
    }
    let ds = &r.dataset;
    if let Some(plan) = &r.plan {
        let verb = if r.dry_run { "would " } else { "" };
        if let (Some(c), true) = (&plan.create, r.dry_run) {
            outln(&format!("would create   {ds}@{c}  {}", plan.create_reason));
        }
        if let (Some(c), false) = (&r.created, r.dry_run) {
            outln(&format!("created  {ds}@{c}  {}", plan.create_reason));
        }
        if r.dry_run {
            print_rules(plan);
            print_decisions(ds, plan, verb, true);
        } else {
            for d in plan
                .destroy
                .iter()
                .filter(|d| r.destroyed.contains(&d.name))
            {
                outln(&format!(
                    "destroyed  {ds}@{}  {}",
                    d.name,
                    d.reasons.join("; ")
                ));
            }
        }
    }
    outln(&format!(
        "{} {}",
        if r.dry_run {
            "would reclaim"
        } else {
            "reclaimed"
        },
        size_cell(r.freed, a.parsable)
    ));
    if !r.errors.is_empty() {
        for e in &r.errors {
            eprintln!("cistern: {e}");
        }
        bail!("policy run on '{ds}' had {} error(s)", r.errors.len());
    }
    Ok(())
}

fn history(client: &api::Client, a: HistoryArgs) -> Result<()> {
    let rows: Vec<PolicyRun> = client.policy_history(a.dataset.as_deref())?;
    if a.format.json {
        return json(&rows);
    }
    let mut t = Table::new(&[
        "TIME",
        "DATASET",
        "POLICY",
        "TRIGGER",
        "CREATED",
        "DESTROYED",
        "FREED",
        "ERRORS",
    ]);
    t.align_right(5);
    t.align_right(6);
    for r in rows {
        t.push(vec![
            display(r.time),
            r.dataset,
            r.policy,
            r.trigger,
            dash(r.created),
            r.destroyed_count.max(r.destroyed.len()).to_string(),
            size_cell(r.freed, a.format.parsable),
            dash(Some(r.errors.join("; "))),
        ]);
    }
    out(&t.render(a.format.scripted));
    Ok(())
}

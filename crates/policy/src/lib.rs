//! Snapshot policies: decide what to snapshot and what to prune.
//!
//! One job, no I/O: given a [`Policy`], the dataset's snapshots, the last-run
//! record and the time (a clock the caller passes in), [`plan`] says which
//! snapshot to take now and which automatic snapshots to destroy, with the
//! rule behind every decision. The daemon applies the plan (one snapshot,
//! one destroy transaction); tests drive it with a simulated clock.
//!
//! Retention has restic's `forget --keep-*` semantics: `hourly=24` keeps the
//! newest snapshot of each of the last 24 hours that have snapshots;
//! `keep-within=48h` keeps everything newer than the newest snapshot minus
//! 48 hours. Periods and names are UTC. Only snapshots whose name starts
//! with the policy's prefix are automatic; every other snapshot is manual
//! and never pruned. Held snapshots are never pruned.

mod schedule;
pub mod time;

pub use schedule::{Cron, Schedule, DEFAULT_FREQUENT_MINUTES};

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("bad schedule {0}")]
    Schedule(String),
    #[error("bad retention {0}")]
    Keep(String),
    #[error("policy '{policy}': {why}")]
    Policy { policy: String, why: String },
    #[error("unknown policy '{0}' (not in the config and not built in)")]
    UnknownPolicy(String),
}

/// A count in the retention grid that keeps every period.
pub const ALL: u32 = u32::MAX;
pub const DEFAULT_PREFIX: &str = "auto-";
/// The built-in policy's name.
pub const TIMEMACHINE: &str = "timemachine";
/// Pool capacity (percent) past which the built-in policy prunes oldest first.
pub const DEFAULT_CAPACITY_PERCENT: f64 = 80.0;

/// Periods a retention rule counts, finest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Frequent,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Yearly,
}

impl Period {
    pub const ALL: [Period; 6] = [
        Period::Frequent,
        Period::Hourly,
        Period::Daily,
        Period::Weekly,
        Period::Monthly,
        Period::Yearly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Period::Frequent => "frequent",
            Period::Hourly => "hourly",
            Period::Daily => "daily",
            Period::Weekly => "weekly",
            Period::Monthly => "monthly",
            Period::Yearly => "yearly",
        }
    }

    /// The period (as a number, equal for equal periods) containing `t`.
    fn bucket(self, t: i64, frequent_minutes: u32) -> i64 {
        let day = t.div_euclid(86_400);
        match self {
            Period::Frequent => t.div_euclid(i64::from(frequent_minutes.max(1)) * 60),
            Period::Hourly => t.div_euclid(3600),
            Period::Daily => day,
            // Weeks start on Monday; 1970-01-01 was a Thursday.
            Period::Weekly => (day + 3).div_euclid(7),
            Period::Monthly => {
                let c = time::civil(t);
                c.year * 12 + i64::from(c.month)
            }
            Period::Yearly => time::civil(t).year,
        }
    }

    /// How the period containing `t` is named in reasons.
    fn label(self, t: i64, frequent_minutes: u32) -> String {
        let c = time::civil(t);
        match self {
            Period::Frequent => {
                let start = self.bucket(t, frequent_minutes) * i64::from(frequent_minutes) * 60;
                time::stamp(start, false)
            }
            Period::Hourly => format!("{:04}-{:02}-{:02}T{:02}Z", c.year, c.month, c.day, c.hour),
            Period::Daily => format!("{:04}-{:02}-{:02}", c.year, c.month, c.day),
            Period::Weekly => {
                let monday = t.div_euclid(86_400) - i64::from(c.weekday);
                let (y, m, d) = time::civil_from_days(monday);
                format!("week of {y:04}-{m:02}-{d:02}")
            }
            Period::Monthly => format!("{:04}-{:02}", c.year, c.month),
            Period::Yearly => format!("{:04}", c.year),
        }
    }
}

/// The retention grid: `keep frequent=4 hourly=24 daily=31 weekly=8 monthly=12 yearly=0`
/// plus `last=N` and `within=48h`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Keep {
    /// The newest N automatic snapshots (restic `--keep-last`).
    pub last: u32,
    /// Count per period, in [`Period::ALL`] order; [`ALL`] keeps every period.
    pub counts: [u32; 6],
    /// Everything newer than the newest snapshot minus this many seconds.
    pub within_secs: Option<i64>,
    /// Length of a `frequent` period.
    pub frequent_minutes: u32,
}

impl Keep {
    /// Parses `frequent=4 hourly=24 daily=31 weekly=all within=48h last=3`
    /// (spaces or commas between rules).
    pub fn parse(s: &str) -> Result<Keep, Error> {
        let mut k = Keep {
            frequent_minutes: DEFAULT_FREQUENT_MINUTES,
            ..Keep::default()
        };
        for item in s.split([' ', ',']).filter(|i| !i.is_empty()) {
            let bad = |why: &str| Error::Keep(format!("'{item}': {why}"));
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad("expected RULE=COUNT"))?;
            let count = || -> Result<u32, Error> {
                match value {
                    "all" | "-1" => Ok(ALL),
                    v => v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n < ALL)
                        .ok_or_else(|| bad("expected a count or 'all'")),
                }
            };
            match key {
                "last" => k.last = count()?,
                "within" | "keep-within" | "keep_within" => {
                    k.within_secs = Some(parse_duration(value)?)
                }
                _ => {
                    let p = Period::ALL.iter().position(|p| p.name() == key).ok_or_else(|| {
                        bad("unknown rule (last, frequent, hourly, daily, weekly, monthly, yearly, within)")
                    })?;
                    k.counts[p] = count()?;
                }
            }
        }
        Ok(k)
    }

    pub fn count(&self, p: Period) -> u32 {
        self.counts[p as usize]
    }

    /// The default grid of `snapshot:schedule=...` without a named policy.
    pub fn default_grid() -> Keep {
        Keep::parse("frequent=4 hourly=24 daily=31 weekly=8 monthly=12 yearly=0")
            .unwrap_or_default()
    }

    /// Time Machine: hourly for a day, daily for a month, weekly after that.
    pub fn timemachine() -> Keep {
        Keep::parse("hourly=24 daily=31 weekly=all").unwrap_or_default()
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let show = |n: u32| {
            if n == ALL {
                "all".to_string()
            } else {
                n.to_string()
            }
        };
        if self.last > 0 {
            parts.push(format!("last={}", show(self.last)));
        }
        for p in Period::ALL {
            if self.count(p) > 0 {
                parts.push(format!("{}={}", p.name(), show(self.count(p))));
            }
        }
        if let Some(w) = self.within_secs {
            parts.push(format!("within={}", format_duration(w)));
        }
        if parts.is_empty() {
            parts.push("(nothing but the newest)".into());
        }
        f.write_str(&parts.join(" "))
    }
}

/// `48h`, `30m`, `7d`, `2w`, `1d12h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<i64, Error> {
    let bad = || Error::Keep(format!("'{s}': expected a duration like 48h, 30m, 7d, 2w"));
    let mut total: i64 = 0;
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(bad()),
        };
        let n: i64 = num.parse().map_err(|_| bad())?;
        total = total
            .checked_add(n.checked_mul(unit).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        num.clear();
    }
    if !num.is_empty() {
        total = total
            .checked_add(num.parse::<i64>().map_err(|_| bad())?)
            .ok_or_else(bad)?;
    }
    if s.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

fn format_duration(mut secs: i64) -> String {
    let mut out = String::new();
    for (unit, len) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= len {
            out.push_str(&format!("{}{unit}", secs / len));
            secs %= len;
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// A `[policy.NAME]` table of the daemon's TOML config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// `frequently[=MINUTES]`, `hourly`, `daily`, `weekly`, `monthly`, `yearly`, `cron=M H DOM MON DOW`.
    pub schedule: String,
    /// The retention grid, e.g. `hourly=24 daily=31 weekly=8`.
    pub keep: Option<String>,
    /// `keep-within`, e.g. `48h`.
    pub keep_within: Option<String>,
    /// Names of automatic snapshots start with it (default `auto-`).
    pub prefix: Option<String>,
    /// Pool capacity in percent past which the oldest automatic snapshots go first.
    pub capacity: Option<f64>,
    /// Commands run (through `sh -c`) before and after the snapshot.
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_secs: Option<f64>,
    /// Event snapshots (the last client of a volume disconnects after
    /// writing): at most one per this interval, e.g. `10m`; unset = off.
    pub event_min_interval: Option<String>,
}

/// A policy, checked and ready to plan with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Policy {
    pub name: String,
    #[serde(serialize_with = "display")]
    pub schedule: Schedule,
    #[serde(serialize_with = "display")]
    pub keep: Keep,
    pub prefix: String,
    pub capacity_percent: Option<f64>,
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_secs: f64,
    /// Event snapshots: minimum seconds between two; `None` = no event snapshots.
    pub event_min_interval_secs: Option<i64>,
    /// Where it comes from: `config`, `built-in` or `schedule property`.
    pub origin: String,
}

fn display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

pub const DEFAULT_HOOK_TIMEOUT_SECS: f64 = 60.0;

impl Policy {
    pub fn from_config(name: &str, c: &PolicyConfig) -> Result<Policy, Error> {
        let err = |why: String| Error::Policy {
            policy: name.to_string(),
            why,
        };
        check_name_part("policy name", name).map_err(&err)?;
        let builtin = (name == TIMEMACHINE).then(Policy::timemachine);
        let schedule = match (&builtin, c.schedule.trim()) {
            (Some(b), "") => b.schedule.clone(),
            (_, s) => Schedule::parse(s).map_err(|e| err(e.to_string()))?,
        };
        let mut keep = match (&builtin, &c.keep) {
            (_, Some(k)) => Keep::parse(k).map_err(|e| err(e.to_string()))?,
            (Some(b), None) => b.keep.clone(),
            (None, None) => Keep::default_grid(),
        };
        if let Schedule::Frequently(n) = schedule {
            keep.frequent_minutes = n;
        }
        if let Some(w) = &c.keep_within {
            keep.within_secs = Some(parse_duration(w).map_err(|e| err(e.to_string()))?);
        }
        let prefix = c.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.into());
        check_name_part("prefix", &prefix).map_err(&err)?;
        let capacity_percent = match c.capacity {
            Some(p) if !(1.0..=100.0).contains(&p) => {
                return Err(err(format!(
                    "capacity {p} must be a percentage from 1 to 100"
                )))
            }
            Some(p) => Some(p),
            None => builtin.as_ref().and_then(|b| b.capacity_percent),
        };
        let hook_timeout_secs = c.hook_timeout_secs.unwrap_or(DEFAULT_HOOK_TIMEOUT_SECS);
        if !(0.0..=86_400.0).contains(&hook_timeout_secs) || hook_timeout_secs == 0.0 {
            return Err(err(format!(
                "hook_timeout_secs {hook_timeout_secs} must be between 0 and 86400"
            )));
        }
        let event_min_interval_secs = match &c.event_min_interval {
            Some(d) => Some(parse_duration(d).map_err(|e| err(e.to_string()))?),
            None => None,
        };
        Ok(Policy {
            name: name.to_string(),
            schedule,
            keep,
            prefix,
            capacity_percent,
            pre_hook: c.pre_hook.clone().filter(|h| !h.trim().is_empty()),
            post_hook: c.post_hook.clone().filter(|h| !h.trim().is_empty()),
            hook_timeout_secs,
            event_min_interval_secs,
            origin: "config".into(),
        })
    }

    /// The built-in `timemachine` policy.
    pub fn timemachine() -> Policy {
        Policy {
            name: TIMEMACHINE.into(),
            schedule: Schedule::Hourly,
            keep: Keep::timemachine(),
            prefix: DEFAULT_PREFIX.into(),
            capacity_percent: Some(DEFAULT_CAPACITY_PERCENT),
            pre_hook: None,
            post_hook: None,
            hook_timeout_secs: DEFAULT_HOOK_TIMEOUT_SECS,
            event_min_interval_secs: None,
            origin: "built-in".into(),
        }
    }

    /// What `snapshot:schedule=S` means without `snapshot:policy`: that
    /// schedule with the default grid.
    pub fn for_schedule(schedule: &str) -> Result<Policy, Error> {
        let schedule = Schedule::parse(schedule)?;
        let mut keep = Keep::default_grid();
        if let Schedule::Frequently(n) = schedule {
            keep.frequent_minutes = n;
        }
        Ok(Policy {
            name: format!("schedule:{schedule}"),
            schedule,
            keep,
            prefix: DEFAULT_PREFIX.into(),
            capacity_percent: None,
            pre_hook: None,
            post_hook: None,
            hook_timeout_secs: DEFAULT_HOOK_TIMEOUT_SECS,
            event_min_interval_secs: None,
            origin: "schedule property".into(),
        })
    }

    /// Whether a snapshot (short name, after `@`) is one of this policy's.
    pub fn is_automatic(&self, name: &str) -> bool {
        name.starts_with(&self.prefix)
    }

    /// The time an automatic snapshot stands for: the stamp in its name,
    /// else its creation time.
    pub fn time_of(&self, s: &SnapshotEntry) -> i64 {
        s.name
            .strip_prefix(&self.prefix)
            .and_then(time::parse_stamp)
            .unwrap_or(s.created)
    }
}

/// The named policies: the config's tables plus the built-in ones.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub by_name: BTreeMap<String, Policy>,
}

impl Policies {
    pub fn from_config(tables: &BTreeMap<String, PolicyConfig>) -> Result<Policies, Error> {
        let mut by_name = BTreeMap::new();
        by_name.insert(TIMEMACHINE.to_string(), Policy::timemachine());
        for (name, c) in tables {
            by_name.insert(name.clone(), Policy::from_config(name, c)?);
        }
        Ok(Policies { by_name })
    }

    pub fn get(&self, name: &str) -> Result<&Policy, Error> {
        self.by_name
            .get(name)
            .ok_or_else(|| Error::UnknownPolicy(name.into()))
    }

    /// The policy the two dataset properties name. The caller passes only
    /// the one set nearest the dataset (`snapshot:policy` on a tie); `none`
    /// or `off` there opts the dataset out; unset (`None`, `-`) is no policy.
    pub fn resolve(
        &self,
        policy: Option<&str>,
        schedule: Option<&str>,
    ) -> Result<Option<Policy>, Error> {
        fn set(v: Option<&str>) -> Option<&str> {
            v.map(str::trim).filter(|v| !["", "-"].contains(v))
        }
        let off = |v: &str| v == "none" || v == "off";
        if let Some(name) = set(policy) {
            return if off(name) {
                Ok(None)
            } else {
                self.get(name).cloned().map(Some)
            };
        }
        match set(schedule) {
            Some(s) if off(s) => Ok(None),
            Some(s) => Policy::for_schedule(s).map(Some),
            None => Ok(None),
        }
    }
}

fn check_name_part(what: &str, s: &str) -> Result<(), String> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.len() <= 100
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} '{s}' must start with a letter and contain only letters, digits, '_', '-', '.', ':'"
        ))
    }
}

/// One snapshot of the dataset, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// The short name (after `@`).
    pub name: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Held (user holds, or the last common snapshot of a replication): never pruned.
    pub held: bool,
}

/// What the planner is asked.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub now: i64,
    pub snapshots: &'a [SnapshotEntry],
    /// When the policy last ran for this dataset (persisted by the caller).
    pub last_run: Option<i64>,
    /// Take a snapshot even if none is due (`policy run`).
    pub force: bool,
    /// Whether a snapshot may be taken at all (false: prune only, e.g. after a failed pre-hook).
    pub take: bool,
}

/// How full the pool would be after destroying some snapshots.
pub trait Capacity {
    /// Percent of the pool in use once `destroyed` (short names) are gone.
    fn percent_after(&self, destroyed: &[&str]) -> f64;
}

/// One snapshot and why it is kept or destroyed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub name: String,
    pub time: i64,
    pub reasons: Vec<String>,
}

/// Which snapshots one rule keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleKeeps {
    pub rule: String,
    pub kept: Vec<String>,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub policy: String,
    pub now: i64,
    /// The snapshot to take (short name), if any.
    pub create: Option<String>,
    /// Why it is (or is not) taken.
    pub create_reason: String,
    /// Automatic snapshots kept, newest first (including the one to take).
    pub keep: Vec<Decision>,
    /// Automatic snapshots to destroy, oldest first.
    pub destroy: Vec<Decision>,
    /// Manual snapshots (names without the prefix): never touched.
    pub manual: Vec<String>,
    pub rules: Vec<RuleKeeps>,
    /// The start of the next slot after `now`.
    pub next_run: Option<i64>,
}

/// Whether a run is due: no run since the start of the current slot. The
/// last run is the later of the persisted record and the newest automatic
/// snapshot, so after any downtime this is one run, not one per missed slot.
pub fn due(
    policy: &Policy,
    now: i64,
    snapshots: &[SnapshotEntry],
    last_run: Option<i64>,
) -> (bool, String) {
    let newest = snapshots
        .iter()
        .filter(|s| policy.is_automatic(&s.name))
        .map(|s| policy.time_of(s))
        .max();
    let last = newest.max(last_run);
    match (policy.schedule.slot_start(now), last) {
        (None, _) => (false, format!("schedule {} has no slot", policy.schedule)),
        (Some(_), None) => (true, "no automatic snapshot yet".into()),
        (Some(slot), Some(l)) if l < slot => (
            true,
            format!(
                "{} slot started {}; last run {}",
                policy.schedule,
                time::display(slot),
                time::display(l)
            ),
        ),
        (Some(slot), Some(l)) => (
            false,
            format!(
                "not due: last run {} is in the {} slot that started {}",
                time::display(l),
                policy.schedule,
                time::display(slot)
            ),
        ),
    }
}

/// An event (the last client of a volume disconnected after writing): due
/// unless event snapshots are off for the policy or the newest automatic
/// snapshot is younger than the minimum interval, so a flapping client
/// cannot create thousands. When due, the caller runs [`plan`] with `force`.
pub fn event_due(policy: &Policy, now: i64, snapshots: &[SnapshotEntry]) -> (bool, String) {
    let Some(min) = policy.event_min_interval_secs else {
        return (false, "event snapshots are off for this policy".into());
    };
    let newest = snapshots
        .iter()
        .filter(|s| policy.is_automatic(&s.name))
        .map(|s| policy.time_of(s).max(s.created))
        .max();
    match newest {
        Some(t) if now - t < min => (
            false,
            format!(
                "newest automatic snapshot is {}s old, under the {} minimum interval",
                now - t,
                format_duration(min)
            ),
        ),
        _ => (true, "written, then the last client disconnected".into()),
    }
}

/// Decides what to take and what to prune (see the crate docs).
pub fn plan(policy: &Policy, input: Input<'_>, capacity: Option<&dyn Capacity>) -> Plan {
    let now = input.now;
    let (is_due, why) = due(policy, now, input.snapshots, input.last_run);
    let taken: HashSet<&str> = input.snapshots.iter().map(|s| s.name.as_str()).collect();
    let (create, create_reason) = if !input.take {
        (None, "no snapshot taken".to_string())
    } else if is_due || input.force {
        let reason = if is_due {
            why
        } else {
            "run now (forced)".into()
        };
        // Minute names, with seconds when a forced run repeats a minute.
        let names = [
            format!("{}{}", policy.prefix, time::stamp(now, false)),
            format!("{}{}", policy.prefix, time::stamp(now, true)),
        ];
        match names.into_iter().find(|n| !taken.contains(n.as_str())) {
            Some(n) => (Some(n), reason),
            None => (
                None,
                format!("a snapshot named for {} exists", time::display(now)),
            ),
        }
    } else {
        (None, why)
    };

    let mut auto: Vec<(i64, &str, bool)> = input
        .snapshots
        .iter()
        .filter(|s| policy.is_automatic(&s.name))
        .map(|s| (policy.time_of(s), s.name.as_str(), s.held))
        .collect();
    if let Some(c) = &create {
        auto.push((now, c.as_str(), false));
    }
    // Newest first; equal times by name so the order never depends on input order.
    auto.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));

    let mut reasons: Vec<Vec<String>> = vec![Vec::new(); auto.len()];
    let mut rules = Vec::new();
    if !auto.is_empty() {
        reasons[0].push("newest automatic snapshot".into());
    }
    if policy.keep.last > 0 {
        let mut kept = Vec::new();
        for (i, s) in auto.iter().enumerate().take(policy.keep.last as usize) {
            reasons[i].push(format!(
                "last={}: {} of the newest",
                policy.keep.last,
                i + 1
            ));
            kept.push(s.1.to_string());
        }
        rules.push(RuleKeeps {
            rule: format!("last={}", policy.keep.last),
            kept,
        });
    }
    let fm = policy.keep.frequent_minutes;
    for p in Period::ALL {
        let max = policy.keep.count(p);
        if max == 0 {
            continue;
        }
        let rule = if max == ALL {
            format!("{}=all", p.name())
        } else {
            format!("{}={max}", p.name())
        };
        let mut kept = Vec::new();
        let mut last_bucket = None;
        for (i, s) in auto.iter().enumerate() {
            if kept.len() as u32 >= max {
                break;
            }
            let b = p.bucket(s.0, fm);
            if last_bucket != Some(b) {
                last_bucket = Some(b);
                kept.push(s.1.to_string());
                let n = if max == ALL {
                    "all".to_string()
                } else {
                    max.to_string()
                };
                reasons[i].push(format!(
                    "{rule}: newest of {} ({} of {n})",
                    p.label(s.0, fm),
                    kept.len()
                ));
            }
        }
        rules.push(RuleKeeps { rule, kept });
    }
    if let (Some(w), Some(newest)) = (policy.keep.within_secs, auto.first().map(|s| s.0)) {
        let rule = format!("within={}", format_duration(w));
        let mut kept = Vec::new();
        for (i, s) in auto.iter().enumerate() {
            if s.0 >= newest - w {
                reasons[i].push(format!("{rule}: newer than {}", time::display(newest - w)));
                kept.push(s.1.to_string());
            }
        }
        rules.push(RuleKeeps { rule, kept });
    }
    for (i, s) in auto.iter().enumerate() {
        if s.2 {
            reasons[i].push("held".into());
        }
    }

    let mut keep = Vec::new();
    let mut destroy = Vec::new();
    for (s, r) in auto.iter().zip(reasons) {
        let d = Decision {
            name: s.1.to_string(),
            time: s.0,
            reasons: r,
        };
        if d.reasons.is_empty() {
            destroy.push(Decision {
                reasons: vec!["no rule keeps it".into()],
                ..d
            });
        } else {
            keep.push(d);
        }
    }
    destroy.reverse();

    // Past the capacity threshold, the oldest automatic snapshots go first,
    // whatever the grid says - but never a held one, never the newest.
    if let (Some(limit), Some(cap)) = (policy.capacity_percent, capacity) {
        loop {
            let names: Vec<&str> = destroy.iter().map(|d| d.name.as_str()).collect();
            let used = cap.percent_after(&names);
            if used <= limit {
                break;
            }
            let victim = keep
                .iter()
                .enumerate()
                .skip(1)
                .rev()
                .find(|(_, d)| {
                    !d.reasons.iter().any(|r| r == "held") && Some(&d.name) != create.as_ref()
                })
                .map(|(i, _)| i);
            let Some(i) = victim else { break };
            let d = keep.remove(i);
            destroy.push(Decision {
                reasons: vec![format!(
                    "capacity: pool {used:.1}% full > {limit}%: oldest automatic snapshot first"
                )],
                ..d
            });
        }
        destroy.sort_by(|a, b| a.time.cmp(&b.time).then_with(|| a.name.cmp(&b.name)));
        for r in &mut rules {
            r.kept.retain(|n| keep.iter().any(|k| &k.name == n));
        }
    }

    let manual = input
        .snapshots
        .iter()
        .filter(|s| !policy.is_automatic(&s.name))
        .map(|s| s.name.clone())
        .collect();
    Plan {
        policy: policy.name.clone(),
        now,
        create,
        create_reason,
        keep,
        destroy,
        manual,
        rules,
        next_run: policy.schedule.next_after(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flapping_client_gets_one_event_snapshot_per_interval() {
        let c = PolicyConfig {
            schedule: "daily".into(),
            event_min_interval: Some("10m".into()),
            ..Default::default()
        };
        let p = Policy::from_config("backup", &c).unwrap();
        assert!(!event_due(&Policy::timemachine(), 0, &[]).0);
        let mut snaps: Vec<SnapshotEntry> = Vec::new();
        let start = 1_795_240_800;
        // Disconnects every 30 s for an hour.
        for i in 0..120 {
            let now = start + i * 30;
            if event_due(&p, now, &snaps).0 {
                let pl = plan(
                    &p,
                    Input {
                        now,
                        snapshots: &snaps,
                        last_run: None,
                        force: true,
                        take: true,
                    },
                    None,
                );
                snaps.push(SnapshotEntry {
                    name: pl.create.unwrap(),
                    created: now,
                    held: false,
                });
            }
        }
        assert_eq!(snaps.len(), 6, "{snaps:?}");
        let bad = PolicyConfig {
            event_min_interval: Some("soon".into()),
            ..c
        };
        assert!(Policy::from_config("backup", &bad).is_err());
    }

    #[test]
    fn keep_grids_parse_and_print() {
        let k = Keep::parse("frequent=4 hourly=24 daily=31 weekly=8 monthly=12 yearly=0").unwrap();
        assert_eq!(k.count(Period::Weekly), 8);
        assert_eq!(
            k.to_string(),
            "frequent=4 hourly=24 daily=31 weekly=8 monthly=12"
        );
        let k = Keep::parse("within=1d12h, weekly=all").unwrap();
        assert_eq!(k.within_secs, Some(36 * 3600));
        assert_eq!(k.to_string(), "weekly=all within=1d12h");
        for bad in [
            "hourly",
            "hourly=x",
            "fortnightly=2",
            "within=3y",
            "within=",
        ] {
            assert!(Keep::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_tables_become_policies() {
        let text = r#"
            [vm]
            schedule = "frequently=5"
            keep = "frequent=4 hourly=24"
            keep_within = "48h"
            prefix = "vm-"
            [timemachine]
            capacity = 90
            [bad]
            schedule = "fortnightly"
        "#;
        let mut tables: BTreeMap<String, PolicyConfig> = toml::from_str(text).unwrap();
        let bad = tables.remove("bad").unwrap();
        let e = Policy::from_config("bad", &bad).unwrap_err().to_string();
        assert!(
            e.contains("policy 'bad'") && e.contains("fortnightly"),
            "{e}"
        );
        let p = Policies::from_config(&tables).unwrap();
        let vm = p.get("vm").unwrap();
        assert_eq!(vm.keep.frequent_minutes, 5);
        assert_eq!(vm.keep.within_secs, Some(48 * 3600));
        let tm = p.get(TIMEMACHINE).unwrap();
        assert_eq!(tm.capacity_percent, Some(90.0));
        assert_eq!(tm.schedule, Schedule::Hourly);
        assert_eq!(tm.keep, Keep::timemachine());
        assert!(p.get("nope").is_err());
        assert_eq!(
            p.resolve(None, Some("daily")).unwrap().unwrap().name,
            "schedule:daily"
        );
        assert!(p.resolve(Some("none"), Some("daily")).unwrap().is_none());
        assert!(p.resolve(None, Some("none")).unwrap().is_none());
        assert!(p.resolve(Some("off"), None).unwrap().is_none());
    }
}

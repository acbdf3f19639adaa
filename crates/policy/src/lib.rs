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
    #[error("bad event {0}")]
    Event(String),
}

/// A count in the retention grid that keeps every period.
pub const ALL: u32 = u32::MAX;
pub const DEFAULT_PREFIX: &str = "auto-";
/// The built-in policy's name.
pub const TIMEMACHINE: &str = "timemachine";
/// Pool capacity (percent) past which the built-in policy prunes oldest first.
pub const DEFAULT_CAPACITY_PERCENT: f64 = 80.0;
/// Event snapshots: at most one automatic snapshot per this many seconds.
pub const DEFAULT_EVENT_MIN_INTERVAL_SECS: i64 = 600;
/// `s3-quiet`: a bucket counts as quiet this long after its last write.
pub const DEFAULT_S3_QUIET_SECS: i64 = 300;

/// What ended a backup: the events a policy can take a snapshot on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The last NBD client of a volume disconnected after writing.
    NbdDisconnect,
    /// A bucket had no writes for the policy's `s3_quiet` after some.
    S3Quiet,
    /// A file share's client disconnected after writing (Time Machine
    /// finished, an SMB/NFS session closed): the share layers report it.
    ShareDisconnect,
}

impl EventKind {
    pub const ALL: [EventKind; 3] = [
        EventKind::NbdDisconnect,
        EventKind::S3Quiet,
        EventKind::ShareDisconnect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::NbdDisconnect => "nbd-disconnect",
            EventKind::S3Quiet => "s3-quiet",
            EventKind::ShareDisconnect => "share-disconnect",
        }
    }

    pub fn parse(s: &str) -> Result<EventKind, Error> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                Error::Event(format!(
                    "'{s}': expected nbd-disconnect, s3-quiet or share-disconnect"
                ))
            })
    }

    /// How the event reads in reasons and the history.
    pub fn describe(self) -> &'static str {
        match self {
            EventKind::NbdDisconnect => "the last NBD client disconnected after writing",
            EventKind::S3Quiet => "the bucket went quiet after writes",
            EventKind::ShareDisconnect => "a share client disconnected after writing",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// Event snapshots: which events take one (`nbd-disconnect`,
    /// `s3-quiet`, `share-disconnect`). Unset: none, unless
    /// `event_min_interval` is set, which alone turns on all three.
    pub events: Option<Vec<String>>,
    /// At most one automatic snapshot per this interval from events (a
    /// flapping client); default `10m`. An event inside it is deferred to its end.
    pub event_min_interval: Option<String>,
    /// `s3-quiet`: how long a bucket must go without writes; default `5m`.
    pub s3_quiet: Option<String>,
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
    /// The events that take a snapshot (empty: none).
    pub events: Vec<EventKind>,
    /// Minimum seconds between an automatic snapshot and an event snapshot.
    pub event_min_interval_secs: i64,
    /// `s3-quiet`: seconds without writes after which a bucket is quiet.
    pub s3_quiet_secs: i64,
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
        let duration = |d: &Option<String>, default: i64| -> Result<i64, Error> {
            match d {
                Some(d) => parse_duration(d).map_err(|e| err(e.to_string())),
                None => Ok(default),
            }
        };
        let event_min_interval_secs =
            duration(&c.event_min_interval, DEFAULT_EVENT_MIN_INTERVAL_SECS)?;
        let s3_quiet_secs = duration(&c.s3_quiet, DEFAULT_S3_QUIET_SECS)?;
        if s3_quiet_secs < 1 {
            return Err(err("s3_quiet must be at least 1s".into()));
        }
        let mut events = match (&c.events, &c.event_min_interval) {
            (Some(list), _) => list
                .iter()
                .map(|e| EventKind::parse(e).map_err(|e| err(e.to_string())))
                .collect::<Result<Vec<_>, _>>()?,
            // `event_min_interval` alone (the first form of this table): every event.
            (None, Some(_)) => EventKind::ALL.to_vec(),
            (None, None) => builtin
                .as_ref()
                .map(|b| b.events.clone())
                .unwrap_or_default(),
        };
        events.sort();
        events.dedup();
        Ok(Policy {
            name: name.to_string(),
            schedule,
            keep,
            prefix,
            capacity_percent,
            pre_hook: c.pre_hook.clone().filter(|h| !h.trim().is_empty()),
            post_hook: c.post_hook.clone().filter(|h| !h.trim().is_empty()),
            hook_timeout_secs,
            events,
            event_min_interval_secs,
            s3_quiet_secs,
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
            events: Vec::new(),
            event_min_interval_secs: DEFAULT_EVENT_MIN_INTERVAL_SECS,
            s3_quiet_secs: DEFAULT_S3_QUIET_SECS,
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
            events: Vec::new(),
            event_min_interval_secs: DEFAULT_EVENT_MIN_INTERVAL_SECS,
            s3_quiet_secs: DEFAULT_S3_QUIET_SECS,
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
        (None, _) if policy.schedule == Schedule::Never => (
            false,
            "no schedule: snapshots come from events and `policy run`".into(),
        ),
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

/// What to do with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventDue {
    /// The policy does not take snapshots on this event: forget it.
    Off,
    /// Take one now (the caller runs [`plan`] with `force`).
    Now,
    /// Inside the minimum interval: take one at this time (Unix seconds),
    /// so the end of a flapping client's writes is still captured.
    At(i64),
}

/// An event ended a backup: a snapshot now, unless event snapshots of this
/// kind are off for the policy, or the newest automatic snapshot is younger
/// than the minimum interval (then at the end of it), so a flapping client
/// cannot create thousands.
pub fn event_due(
    policy: &Policy,
    kind: EventKind,
    now: i64,
    snapshots: &[SnapshotEntry],
) -> (EventDue, String) {
    if !policy.events.contains(&kind) {
        return (
            EventDue::Off,
            format!("policy {} takes no snapshots on {kind}", policy.name),
        );
    }
    let min = policy.event_min_interval_secs;
    let newest = snapshots
        .iter()
        .filter(|s| policy.is_automatic(&s.name))
        .map(|s| policy.time_of(s).max(s.created))
        .max();
    match newest {
        Some(t) if now - t < min => (
            EventDue::At(t + min),
            format!(
                "{}: newest automatic snapshot is {}s old, under the {} minimum interval; deferred to {}",
                kind.describe(),
                now - t,
                format_duration(min),
                time::display(t + min)
            ),
        ),
        _ => (EventDue::Now, format!("event {kind}: {}", kind.describe())),
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
    // whatever the grid says - but never a held one, never the newest. The
    // space is what destroying the whole set frees (blocks shared only by
    // snapshots of the set count once, as `destroy -nv` of them says), and
    // freeing grows with the set, so the fewest oldest that bring the pool
    // below the threshold are found by bisection: a few set estimates, not
    // one per candidate.
    if let (Some(limit), Some(cap)) = (policy.capacity_percent, capacity) {
        let candidates: Vec<usize> = (1..keep.len())
            .rev()
            .filter(|&i| {
                let d = &keep[i];
                !d.reasons.iter().any(|r| r == "held") && Some(&d.name) != create.as_ref()
            })
            .collect();
        let after = |k: usize| {
            let names: Vec<&str> = destroy
                .iter()
                .map(|d| d.name.as_str())
                .chain(candidates[..k].iter().map(|&i| keep[i].name.as_str()))
                .collect();
            cap.percent_after(&names)
        };
        let used = after(0);
        if used > limit && !candidates.is_empty() {
            // The smallest k with after(k) <= limit; all of them if none is enough.
            let (mut lo, mut hi) = (1, candidates.len());
            let mut reached = None;
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let pct = after(mid);
                if pct <= limit {
                    hi = mid;
                    reached = Some(pct);
                } else {
                    lo = mid + 1;
                }
            }
            // `reached` is after(hi) from the last time hi moved; else hi never did.
            let reached = reached.unwrap_or_else(|| after(lo));
            let outcome = if reached <= limit {
                format!("{reached:.1}% after this batch")
            } else {
                format!("still {reached:.1}% with every unheld automatic snapshot gone")
            };
            let mut victims: Vec<usize> = candidates[..lo].to_vec();
            victims.sort_unstable_by(|a, b| b.cmp(a));
            for i in victims {
                let d = keep.remove(i);
                destroy.push(Decision {
                    reasons: vec![format!(
                        "capacity: pool {used:.1}% full > {limit}%: oldest automatic snapshots first ({outcome})"
                    )],
                    ..d
                });
            }
        }
        destroy.sort_by(|a, b| a.time.cmp(&b.time).then_with(|| a.name.cmp(&b.name)));
        let kept: HashSet<&str> = keep.iter().map(|k| k.name.as_str()).collect();
        for r in &mut rules {
            r.kept.retain(|n| kept.contains(n.as_str()));
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
            schedule: "none".into(),
            events: Some(vec!["nbd-disconnect".into()]),
            event_min_interval: Some("10m".into()),
            ..Default::default()
        };
        let p = Policy::from_config("backup", &c).unwrap();
        assert_eq!(p.schedule, Schedule::Never);
        assert!(!due(&p, 1_795_240_800, &[], None).0, "none has no slots");
        let tm = Policy::timemachine();
        assert_eq!(
            event_due(&tm, EventKind::NbdDisconnect, 0, &[]).0,
            EventDue::Off
        );
        assert_eq!(event_due(&p, EventKind::S3Quiet, 0, &[]).0, EventDue::Off);
        let mut snaps: Vec<SnapshotEntry> = Vec::new();
        let start = 1_795_240_800;
        let mut deferred = None;
        // Disconnects every 30 s for an hour: one at once, then one at the
        // end of each interval (the deferred event), never more.
        for i in 0..120 {
            let now = start + i * 30;
            let take = match event_due(&p, EventKind::NbdDisconnect, now, &snaps).0 {
                EventDue::Now => true,
                EventDue::At(t) => {
                    assert!(t > now && t <= now + 600);
                    deferred = Some(t);
                    false
                }
                EventDue::Off => unreachable!(),
            } || deferred.is_some_and(|t| t <= now);
            if take {
                deferred = None;
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
        for w in snaps.windows(2) {
            assert!(w[1].created - w[0].created >= 600, "{snaps:?}");
        }
        for bad in [
            PolicyConfig {
                event_min_interval: Some("soon".into()),
                ..c.clone()
            },
            PolicyConfig {
                events: Some(vec!["reboot".into()]),
                ..c.clone()
            },
            PolicyConfig {
                s3_quiet: Some("0s".into()),
                ..c.clone()
            },
        ] {
            assert!(Policy::from_config("backup", &bad).is_err(), "{bad:?}");
        }
        // The first form of the table: an interval alone turns on every event.
        let old = PolicyConfig {
            schedule: "daily".into(),
            event_min_interval: Some("10m".into()),
            ..Default::default()
        };
        let p = Policy::from_config("old", &old).unwrap();
        assert_eq!(p.events, EventKind::ALL.to_vec());
        assert_eq!(p.s3_quiet_secs, DEFAULT_S3_QUIET_SECS);
    }

    /// Space shared by neighbouring snapshots: each alone frees nothing,
    /// the pair frees it all (what the dead lists say of a set).
    struct Shared {
        pairs: Vec<(&'static str, &'static str, f64)>,
        used: f64,
        calls: std::cell::Cell<usize>,
    }

    impl Capacity for Shared {
        fn percent_after(&self, destroyed: &[&str]) -> f64 {
            self.calls.set(self.calls.get() + 1);
            let gone: HashSet<&str> = destroyed.iter().copied().collect();
            self.used
                - self
                    .pairs
                    .iter()
                    .filter(|(a, b, _)| gone.contains(a) && gone.contains(b))
                    .map(|p| p.2)
                    .sum::<f64>()
        }
    }

    #[test]
    fn capacity_prunes_the_fewest_oldest_by_set_space() {
        let c = PolicyConfig {
            schedule: "daily".into(),
            keep: Some("daily=all".into()),
            capacity: Some(80.0),
            ..Default::default()
        };
        let p = Policy::from_config("tm", &c).unwrap();
        let day = 86_400;
        let start = 1_700_006_400;
        let names = [
            "auto-2023-11-15T0000Z",
            "auto-2023-11-16T0000Z",
            "auto-2023-11-17T0000Z",
            "auto-2023-11-18T0000Z",
            "auto-2023-11-19T0000Z",
            "auto-2023-11-20T0000Z",
        ];
        let mut snaps: Vec<SnapshotEntry> = names
            .iter()
            .enumerate()
            .map(|(i, n)| SnapshotEntry {
                name: n.to_string(),
                created: start + i as i64 * day,
                held: false,
            })
            .collect();
        snaps.push(SnapshotEntry {
            name: "manual".into(),
            created: start,
            held: false,
        });
        snaps[0].held = true;
        let cap = Shared {
            // 16/17 and 18/19 each share 6%: one alone frees nothing.
            pairs: vec![(names[1], names[2], 6.0), (names[3], names[4], 6.0)],
            used: 90.0,
            calls: Default::default(),
        };
        let now = start + 5 * day + 60;
        let pl = plan(
            &p,
            Input {
                now,
                snapshots: &snaps,
                last_run: Some(now),
                force: false,
                take: false,
            },
            Some(&cap),
        );
        let gone: Vec<&str> = pl.destroy.iter().map(|d| d.name.as_str()).collect();
        // 90 - 6 = 84 > 80 after the first pair: both pairs go, the held
        // oldest, the manual one and the newest stay.
        assert_eq!(gone, &names[1..5], "{pl:?}");
        assert!(
            pl.destroy[0].reasons[0].contains("78.0% after this batch"),
            "{pl:?}"
        );
        assert!(cap.calls.get() <= 5, "{} estimates", cap.calls.get());
        // A per-snapshot sum would see nothing to gain and prune everything;
        // with a lower bar one pair is enough.
        let p2 = Policy {
            capacity_percent: Some(85.0),
            ..p.clone()
        };
        let pl = plan(
            &p2,
            Input {
                now,
                snapshots: &snaps,
                last_run: Some(now),
                force: false,
                take: false,
            },
            Some(&cap),
        );
        let gone: Vec<&str> = pl.destroy.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(gone, &names[1..3]);
        // Not enough even with all: every unheld automatic one but the newest.
        let p3 = Policy {
            capacity_percent: Some(10.0),
            ..p
        };
        let pl = plan(
            &p3,
            Input {
                now,
                snapshots: &snaps,
                last_run: Some(now),
                force: false,
                take: false,
            },
            Some(&cap),
        );
        let gone: Vec<&str> = pl.destroy.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(gone, &names[1..5]);
        assert!(pl.destroy[0].reasons[0].contains("still 78.0%"), "{pl:?}");
        assert_eq!(pl.manual, vec!["manual".to_string()]);
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

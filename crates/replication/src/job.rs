//! A replication job as the user declares it (`[replication.NAME]` in the
//! config, or `cistern replication add`) and as the manager runs it.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[replication.NAME]`, and the body of `cistern replication add`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobConfig {
    /// A dataset here (push) or `https://HOST:PORT/POOL/DS` (pull).
    pub source: String,
    /// `https://HOST:PORT/POOL/DS` (push) or a dataset here (pull).
    pub target: String,
    /// Must agree with `source`/`target`: the source is the URL.
    pub pull: bool,
    /// The snapshot policy whose retention grid prunes the target.
    pub policy: Option<String>,
    /// The snapshot policy whose retention grid prunes the source (none:
    /// the source keeps its own `snapshot:policy`, if any).
    pub source_policy: Option<String>,
    /// An interval (`10m`, `1h`, `90s`), `after-snapshot` (after every
    /// automatic snapshot of the source; push jobs only) or `manual`.
    pub schedule: Option<String>,
    /// Bytes per second on the stream (`10M`, `512K`, or a number).
    pub bwlimit: Option<String>,
    /// PEM CA file the remote's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// A file holding the remote daemon's API token.
    pub token_file: Option<PathBuf>,
    /// Allow plain `http://` to a host other than loopback.
    pub insecure: bool,
    /// First retry this long after a failure, doubling up to an hour (default 30).
    pub retry_secs: Option<f64>,
}

/// `POST /v1/replication`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddJob {
    pub job: String,
    pub config: JobConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// This daemon sends.
    Push,
    /// This daemon fetches.
    Pull,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Only `cistern replication run`.
    Manual,
    /// Every so many seconds after the last attempt.
    Every(u64),
    /// After each automatic snapshot of the source.
    AfterSnapshot,
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Manual => f.write_str("manual"),
            Schedule::AfterSnapshot => f.write_str("after-snapshot"),
            Schedule::Every(s) => write!(f, "every {}", fmt_secs(*s)),
        }
    }
}

fn fmt_secs(s: u64) -> String {
    match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The other daemon: its API and the dataset there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `https://backup:10810`
    pub base: String,
    pub dataset: String,
}

/// A checked job.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub direction: Direction,
    /// The dataset on this daemon (the source of a push, the target of a pull).
    pub local: String,
    pub remote: Remote,
    pub schedule: Schedule,
    pub bwlimit: Option<u64>,
    pub policy: Option<String>,
    pub source_policy: Option<String>,
    pub retry_secs: f64,
    pub config: JobConfig,
    /// Declared in the config file (not removable with the CLI).
    pub from_config: bool,
}

impl Job {
    pub fn source_name(&self) -> String {
        match self.direction {
            Direction::Push => self.local.clone(),
            Direction::Pull => format!("{}/{}", self.remote.base, self.remote.dataset),
        }
    }

    pub fn target_name(&self) -> String {
        match self.direction {
            Direction::Push => format!("{}/{}", self.remote.base, self.remote.dataset),
            Direction::Pull => self.local.clone(),
        }
    }

    /// The hold tag this job keeps on the last common snapshot, on both sides.
    pub fn hold_tag(&self) -> String {
        hold_tag(&self.name)
    }
}

pub fn hold_tag(job: &str) -> String {
    format!("replication:{job}")
}

/// Job names: as policy names (letters, digits, `_-.:`), at most 64.
pub fn check_name(name: &str) -> Result<()> {
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "job name '{name}' must start with a letter or digit and hold only letters, digits, '_', '-', '.', ':' (at most 64)"
        )))
    }
}

fn is_url(s: &str) -> bool {
    s.starts_with("https://") || s.starts_with("http://")
}

/// `https://backup:10810/tank2/vm` -> base `https://backup:10810`, dataset `tank2/vm`.
pub fn parse_remote(url: &str, insecure: bool) -> Result<Remote> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::Invalid(format!("'{url}' is not a URL")))?;
    let (host_port, dataset) = rest.split_once('/').ok_or_else(|| {
        Error::Invalid(format!(
            "'{url}' names no dataset: expected {scheme}://HOST:PORT/POOL/DATASET"
        ))
    })?;
    let dataset = dataset.trim_end_matches('/');
    if host_port.is_empty() || dataset.is_empty() || dataset.contains('@') {
        return Err(Error::Invalid(format!(
            "'{url}': expected {scheme}://HOST:PORT/POOL/DATASET"
        )));
    }
    if !dataset.contains('/') {
        return Err(Error::Invalid(format!(
            "'{url}': the remote dataset must be below a pool (POOL/DATASET), not a pool's root"
        )));
    }
    let host = match host_port.strip_prefix('[') {
        Some(r) => r.split(']').next().unwrap_or(""),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    match scheme {
        "https" => {}
        "http" => {
            let loopback = matches!(host, "127.0.0.1" | "localhost" | "::1")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback());
            if !loopback && !insecure {
                return Err(Error::Invalid(format!(
                    "'{url}': plain http:// only to 127.0.0.1; use https:// (with --ca) or --insecure"
                )));
            }
        }
        other => {
            return Err(Error::Invalid(format!(
                "'{url}': scheme {other}:// is not supported (https:// or http://)"
            )))
        }
    }
    Ok(Remote {
        base: format!("{scheme}://{host_port}"),
        dataset: dataset.to_string(),
    })
}

/// `10M`, `512K`, `1.5G` (binary units), or bytes.
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim().trim_end_matches("/s").trim_end_matches(['B', 'b']);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(Error::Invalid(format!(
                        "bandwidth '{s}': unknown unit '{c}'"
                    )))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| {
        Error::Invalid(format!(
            "bandwidth '{s}': expected e.g. 10M, 512K or bytes per second"
        ))
    })?;
    let v = n * mult as f64;
    if !(1024.0..1e15).contains(&v) {
        return Err(Error::Invalid(format!(
            "bandwidth '{s}' must be between 1K and 1P per second"
        )));
    }
    Ok(v as u64)
}

pub fn parse_schedule(s: Option<&str>, direction: Direction) -> Result<Schedule> {
    let s = s.map(str::trim).unwrap_or("manual");
    match s {
        "" | "manual" | "none" => Ok(Schedule::Manual),
        "after-snapshot" => {
            if direction == Direction::Pull {
                return Err(Error::Invalid(
                    "--after-snapshot needs the source's daemon: make it a push job there, or give this pull job a --schedule interval".into(),
                ));
            }
            Ok(Schedule::AfterSnapshot)
        }
        other => {
            let secs = dataset::policy::parse_duration(other).map_err(|_| {
                Error::Invalid(format!(
                    "schedule '{other}': expected an interval (30s, 10m, 1h), after-snapshot or manual"
                ))
            })?;
            if secs < 1 {
                return Err(Error::Invalid(format!(
                    "schedule '{other}': the interval must be at least 1s"
                )));
            }
            Ok(Schedule::Every(secs as u64))
        }
    }
}

/// Checks a declared job; `policies` names the grids `policy`/`source_policy` may use.
pub fn check(
    name: &str,
    c: &JobConfig,
    policies: &dataset::policy::Policies,
    from_config: bool,
) -> Result<Job> {
    check_name(name)?;
    let (direction, local, url) = match (is_url(&c.source), is_url(&c.target)) {
        (false, true) => (Direction::Push, &c.source, &c.target),
        (true, false) => (Direction::Pull, &c.target, &c.source),
        (true, true) => {
            return Err(Error::Invalid(
                "source and target are both URLs: one of them must be a dataset on this daemon"
                    .into(),
            ))
        }
        (false, false) => {
            return Err(Error::Invalid(format!(
            "neither '{}' nor '{}' is a URL: the other daemon is https://HOST:PORT/POOL/DATASET",
            c.source, c.target
        )))
        }
    };
    if c.pull && direction != Direction::Pull {
        return Err(Error::Invalid(
            "--pull: the source must be the other daemon's URL and the target a dataset here"
                .into(),
        ));
    }
    if local.is_empty() || local.contains('@') || !local.contains('/') {
        return Err(Error::Invalid(format!(
            "'{local}' must be a dataset below a pool (POOL/DATASET)"
        )));
    }
    let remote = parse_remote(url, c.insecure)?;
    for p in [&c.policy, &c.source_policy].into_iter().flatten() {
        policies
            .get(p)
            .map_err(|e| Error::Invalid(format!("policy '{p}': {e}")))?;
    }
    let retry_secs = c.retry_secs.unwrap_or(30.0);
    if !(0.1..=86_400.0).contains(&retry_secs) {
        return Err(Error::Invalid(
            "retry_secs must be between 0.1 and 86400".into(),
        ));
    }
    Ok(Job {
        name: name.to_string(),
        direction,
        local: local.clone(),
        remote,
        schedule: parse_schedule(c.schedule.as_deref(), direction)?,
        bwlimit: c.bwlimit.as_deref().map(parse_rate).transpose()?,
        policy: c.policy.clone(),
        source_policy: c.source_policy.clone(),
        retry_secs,
        config: c.clone(),
        from_config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> dataset::policy::Policies {
        dataset::policy::Policies::from_config(&Default::default()).unwrap()
    }

    fn cfg(source: &str, target: &str) -> JobConfig {
        JobConfig {
            source: source.into(),
            target: target.into(),
            ..Default::default()
        }
    }

    #[test]
    fn direction_follows_the_url() {
        let j = check(
            "a",
            &cfg("tank/vm", "https://b:1/tank2/vm"),
            &policies(),
            false,
        )
        .unwrap();
        assert_eq!(j.direction, Direction::Push);
        assert_eq!(j.remote.base, "https://b:1");
        assert_eq!(j.remote.dataset, "tank2/vm");
        assert_eq!(j.target_name(), "https://b:1/tank2/vm");
        let mut c = cfg("https://b:1/tank/vm", "tank2/vm");
        c.pull = true;
        let j = check("a", &c, &policies(), false).unwrap();
        assert_eq!(
            (j.direction, j.local.as_str()),
            (Direction::Pull, "tank2/vm")
        );
        let mut c = cfg("tank/vm", "https://b:1/tank2/vm");
        c.pull = true;
        assert!(check("a", &c, &policies(), false).is_err());
        assert!(check("a", &cfg("tank/vm", "tank2/vm"), &policies(), false).is_err());
        assert!(check("a", &cfg("tank", "https://b:1/t/v"), &policies(), false).is_err());
    }

    #[test]
    fn plain_http_only_to_loopback() {
        assert!(parse_remote("http://127.0.0.1:5/t/v", false).is_ok());
        assert!(parse_remote("http://[::1]:5/t/v", false).is_ok());
        let e = parse_remote("http://backup:5/t/v", false).unwrap_err();
        assert!(e.to_string().contains("--insecure"), "{e}");
        assert!(parse_remote("http://backup:5/t/v", true).is_ok());
        assert!(parse_remote("https://backup:5/t", false).is_err());
        assert!(parse_remote("https://backup:5/t/v@s", false).is_err());
        assert!(parse_remote("ftp://backup:5/t/v", false).is_err());
    }

    #[test]
    fn rates_schedules_names_policies() {
        assert_eq!(parse_rate("10M").unwrap(), 10 << 20);
        assert_eq!(parse_rate("512K").unwrap(), 512 << 10);
        assert_eq!(parse_rate("1.5G/s").unwrap(), 3 << 29);
        assert_eq!(parse_rate("4096").unwrap(), 4096);
        assert!(parse_rate("12Q").is_err() && parse_rate("0").is_err() && parse_rate("x").is_err());
        assert_eq!(
            parse_schedule(Some("10m"), Direction::Push).unwrap(),
            Schedule::Every(600)
        );
        assert_eq!(
            parse_schedule(None, Direction::Push).unwrap(),
            Schedule::Manual
        );
        assert_eq!(
            parse_schedule(Some("after-snapshot"), Direction::Push).unwrap(),
            Schedule::AfterSnapshot
        );
        assert!(parse_schedule(Some("after-snapshot"), Direction::Pull).is_err());
        assert!(parse_schedule(Some("fortnightly"), Direction::Push).is_err());
        assert!(check_name("nightly-1").is_ok());
        assert!(check_name("-x").is_err() && check_name("a/b").is_err() && check_name("").is_err());
        let mut c = cfg("tank/vm", "https://b:1/tank2/vm");
        c.policy = Some("nope".into());
        let e = check("a", &c, &policies(), false).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        c.policy = Some("timemachine".into());
        assert!(check("a", &c, &policies(), false).is_ok());
    }

    #[test]
    fn config_tables_refuse_unknown_keys() {
        let t: std::collections::BTreeMap<String, JobConfig> = toml::from_str(
            "[offsite]\nsource = \"tank/vm\"\ntarget = \"https://b:1/t/vm\"\nschedule = \"1h\"\nbwlimit = \"10M\"\n",
        )
        .unwrap();
        assert_eq!(t["offsite"].bwlimit.as_deref(), Some("10M"));
        assert!(toml::from_str::<JobConfig>("sourc = \"x\"\n").is_err());
    }
}

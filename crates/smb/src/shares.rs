//! Which filesystem datasets are shared over SMB and under which names: a
//! pure function of the dataset list (the engine has already resolved
//! inheritance) and the datasets unshared by hand.

use dataset::{DatasetInfo, DatasetKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// One `[share]` section of the generated smb.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub dataset: String,
    /// The SMB share name (`tank_home`, or `sharesmb=name=X`).
    pub name: String,
    /// The dataset's mountpoint.
    pub path: PathBuf,
    /// `sharesmb=guestok=true|false`; None: the daemon's `[smb] guest`.
    pub guest: Option<bool>,
    /// `timemachine=on`: a Time Machine destination.
    pub timemachine: bool,
    /// `tm_max_size` in bytes; None: no limit.
    pub tm_max_size: Option<u64>,
}

/// A dataset that asks to be shared but is not, and why (logged, and the
/// answer to `cistern share DATASET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub dataset: String,
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub shares: Vec<Share>,
    pub problems: Vec<Problem>,
}

/// `sharesmb` as written: `on`, `off`, or options `name=NAME,guestok=true`
/// (illumos's spelling; any options mean on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmbOptions {
    pub on: bool,
    pub name: Option<String>,
    pub guest: Option<bool>,
}

pub fn parse_sharesmb(value: &str) -> Result<SmbOptions, String> {
    match value {
        "off" | "-" | "" => return Ok(SmbOptions::default()),
        "on" => {
            return Ok(SmbOptions {
                on: true,
                ..Default::default()
            })
        }
        _ => {}
    }
    let mut o = SmbOptions {
        on: true,
        ..Default::default()
    };
    for opt in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match opt.split_once('=') {
            Some(("name", n)) => {
                check_share_name(n)?;
                o.name = Some(n.to_string());
            }
            Some(("guestok", v)) => {
                o.guest = Some(match v {
                    "true" | "yes" | "on" => true,
                    "false" | "no" | "off" => false,
                    _ => {
                        return Err(format!(
                            "sharesmb option guestok={v}: expected true or false"
                        ))
                    }
                })
            }
            _ => {
                return Err(format!(
                "unknown sharesmb option '{opt}' (expected on, off, name=NAME, guestok=true|false)"
            ))
            }
        }
    }
    Ok(o)
}

/// zfs's share name for `sharesmb=on`: the dataset name with `/`, `-`, `:`
/// and spaces made `_` (`tank/home` -> `tank_home`).
pub fn default_name(dataset: &str) -> String {
    dataset
        .chars()
        .map(|c| {
            if matches!(c, '/' | '-' | ':' | ' ') {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Names Samba takes as a share name, without its `%` substitutions and
/// without the sections it reserves.
pub fn check_share_name(name: &str) -> Result<(), String> {
    const BAD: &str = "\\/[]:|<>+=;,*?\"%";
    if name.is_empty() || name.chars().count() > 80 {
        return Err(format!("share name '{name}' must be 1 to 80 characters"));
    }
    if let Some(c) = name.chars().find(|c| BAD.contains(*c) || c.is_control()) {
        return Err(format!("share name '{name}' contains '{c}'"));
    }
    if ["global", "homes", "printers", "ipc$"].contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!("share name '{name}' is reserved by Samba"));
    }
    Ok(())
}

fn prop<'a>(d: &'a DatasetInfo, name: &str) -> Option<&'a dataset::Property> {
    d.property(name)
}

/// The datasets to share. `unshared`: datasets taken off by `cistern unshare`.
pub fn plan(datasets: &[DatasetInfo], unshared: &BTreeSet<String>) -> Plan {
    let mut plan = Plan::default();
    // Lowercase name -> dataset: SMB share names are case-insensitive.
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    for d in datasets {
        if d.kind != DatasetKind::Filesystem || unshared.contains(&d.name) {
            continue;
        }
        let value = |p: &str| prop(d, p).map(|p| p.parsable.as_str()).unwrap_or("-");
        let timemachine = value("timemachine") == "on";
        let mut problem = |why: String| {
            plan.problems.push(Problem {
                dataset: d.name.clone(),
                why,
            })
        };
        let opts = match parse_sharesmb(value("sharesmb")) {
            Ok(o) => o,
            Err(e) => {
                problem(e);
                continue;
            }
        };
        if !opts.on && !timemachine {
            continue;
        }
        let name = match &opts.name {
            None => default_name(&d.name),
            Some(n) => {
                // An inherited name=X: the child is X_rest (tank/tm name=tm -> tm_mac1).
                let from = prop(d, "sharesmb")
                    .and_then(|p| p.source.strip_prefix("inherited from "))
                    .map(str::to_string);
                match from.and_then(|a| d.name.strip_prefix(&format!("{a}/")).map(default_name)) {
                    Some(rest) => format!("{n}_{rest}"),
                    None => n.clone(),
                }
            }
        };
        if let Err(e) = check_share_name(&name) {
            problem(e);
            continue;
        }
        let mountpoint = value("mountpoint");
        if !mountpoint.starts_with('/') {
            problem(format!(
                "mountpoint is {mountpoint}: set mountpoint=/PATH to share it"
            ));
            continue;
        }
        if mountpoint.contains(['%', '\n', '\r']) {
            problem(format!(
                "mountpoint {mountpoint:?} has a character smb.conf cannot hold (% or a newline)"
            ));
            continue;
        }
        if value("xattr") == "off" {
            problem(
                "xattr=off: Macs keep Finder info and resource forks in xattrs (streams_xattr)"
                    .into(),
            );
            continue;
        }
        let tm_max_size = match value("tm_max_size") {
            "none" | "-" | "0" => None,
            v => match dataset::props::parse_size(v) {
                Ok(n) => Some(n),
                Err(e) => {
                    problem(format!("tm_max_size: {e}"));
                    continue;
                }
            },
        };
        if let Some(other) = taken.get(&name.to_lowercase()) {
            problem(format!("share name '{name}' is already used by {other}"));
            continue;
        }
        taken.insert(name.to_lowercase(), d.name.clone());
        plan.shares.push(Share {
            dataset: d.name.clone(),
            name,
            path: PathBuf::from(mountpoint),
            guest: opts.guest,
            timemachine,
            tm_max_size,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataset::Property;

    fn fs(name: &str, props: &[(&str, &str, &str)]) -> DatasetInfo {
        DatasetInfo {
            name: name.into(),
            kind: DatasetKind::Filesystem,
            properties: props
                .iter()
                .map(|(n, v, s)| Property {
                    name: (*n).into(),
                    value: (*v).into(),
                    parsable: (*v).into(),
                    source: (*s).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn names_follow_zfs_and_name_option() {
        let ds = [
            fs("tank", &[("sharesmb", "off", "default")]),
            fs(
                "tank/home",
                &[
                    ("sharesmb", "on", "local"),
                    ("mountpoint", "/srv/home", "local"),
                ],
            ),
            fs(
                "tank/tm",
                &[
                    ("sharesmb", "name=Backups", "local"),
                    ("mountpoint", "/srv/tm", "local"),
                ],
            ),
            fs(
                "tank/tm/mac-1",
                &[
                    ("sharesmb", "name=Backups", "inherited from tank/tm"),
                    ("timemachine", "on", "local"),
                    ("tm_max_size", "1T", "local"),
                    ("mountpoint", "/srv/tm/mac-1", "inherited from tank/tm"),
                ],
            ),
        ];
        let p = plan(&ds, &BTreeSet::new());
        assert_eq!(p.problems, vec![]);
        let names: Vec<_> = p.shares.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tank_home", "Backups", "Backups_mac_1"]);
        assert!(p.shares[2].timemachine);
        assert_eq!(p.shares[2].tm_max_size, Some(1 << 40));
    }

    #[test]
    fn problems_are_reported_not_shared() {
        let ds = [
            fs(
                "tank/a",
                &[
                    ("sharesmb", "on", "local"),
                    ("mountpoint", "none", "default"),
                ],
            ),
            fs(
                "tank/b",
                &[
                    ("sharesmb", "nmae=x", "local"),
                    ("mountpoint", "/b", "local"),
                ],
            ),
            fs(
                "tank/c",
                &[
                    ("sharesmb", "name=tank_d", "local"),
                    ("mountpoint", "/c", "local"),
                ],
            ),
            fs(
                "tank/d",
                &[("sharesmb", "on", "local"), ("mountpoint", "/d", "local")],
            ),
            fs(
                "tank/e",
                &[
                    ("timemachine", "on", "local"),
                    ("mountpoint", "/e", "local"),
                ],
            ),
        ];
        let unshared = ["tank/e".to_string()].into();
        let p = plan(&ds, &unshared);
        let names: Vec<_> = p.shares.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tank_d"]);
        let bad: Vec<_> = p.problems.iter().map(|p| p.dataset.as_str()).collect();
        assert_eq!(bad, ["tank/a", "tank/b", "tank/d"]);
        assert!(p.problems[2].why.contains("already used by tank/c"));
    }

    #[test]
    fn share_names_are_checked() {
        assert!(check_share_name("tank_home").is_ok());
        for bad in ["", "a/b", "x%u", "global", "IPC$", &"x".repeat(81)] {
            assert!(check_share_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_sharesmb("name=x,guestok=true").unwrap(),
            SmbOptions {
                on: true,
                name: Some("x".into()),
                guest: Some(true)
            }
        );
        assert!(parse_sharesmb("guestok=maybe").is_err());
    }
}

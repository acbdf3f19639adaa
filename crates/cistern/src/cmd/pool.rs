//! `cistern pool ...`: zpool-style pool management.

use crate::cmd::{size_arg, split_list, OutputFlags};
use crate::format::{human_size, Table};
use crate::output::{json, out, outln};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use dataset::{
    GroupKind, GroupSpec, GroupStatus, ImportablePool, PoolSpec, PoolStatus, PoolSummary,
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
    /// Destroy a pool and all its data.
    Destroy(PoolArg),
    /// Commit and close a pool; it can be imported again later.
    Export(PoolArg),
    /// Import a pool, or without POOL list the pools that can be imported.
    Import(ImportArgs),
    /// Compare layouts for N drives before buying them: capacity, failures
    /// survived, predicted IOPS and MB/s (`-n 12 --size 8T --iops 180 --mbps 250`).
    Plan(Box<crate::cmd::plan::PlanArgs>),
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
    /// Devices: `d0 d1` (stripe), `mirror d0 d1` (mirror), `mirror a b mirror c d`.
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
    /// Pool to show (default: all).
    pub pool: Option<String>,
}

#[derive(Debug, Args)]
pub struct PoolArg {
    pub pool: String,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Directory to search for devices (repeatable; default: the current directory).
    #[arg(short = 'd', value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print JSON (when listing importable pools).
    #[arg(long)]
    pub json: bool,
    /// Pool name or numeric id to import.
    pub pool: Option<String>,
}

pub fn run(client: &api::Client, cmd: PoolCommand) -> Result<()> {
    match cmd {
        PoolCommand::Create(a) => create(client, a),
        PoolCommand::List(a) => list(client, a),
        PoolCommand::Status(a) => status(client, a),
        PoolCommand::Destroy(a) => Ok(client.destroy_pool(&a.pool)?),
        PoolCommand::Export(a) => Ok(client.export_pool(&a.pool)?),
        PoolCommand::Import(a) => import(client, a),
        PoolCommand::Plan(a) => crate::cmd::plan::run(*a),
    }
}

/// Parses a zpool vdev spec. `mirror` starts a mirror group that takes every
/// device up to the next keyword; devices outside a mirror are single-disk
/// groups (striped). Relative paths are made absolute against `cwd`.
pub fn parse_vdev_spec(words: &[String], cwd: &Path) -> Result<Vec<GroupSpec>> {
    let mut groups: Vec<GroupSpec> = Vec::new();
    let mut in_mirror = false;
    let mut seen = HashSet::new();
    for w in words {
        match w.as_str() {
            "mirror" => {
                in_mirror = true;
                groups.push(GroupSpec {
                    kind: GroupKind::Mirror,
                    devices: Vec::new(),
                });
                continue;
            }
            "raidz" | "raidz1" | "raidz2" | "raidz3" | "draid" | "spare" | "log" | "cache"
            | "special" | "dedup" => {
                bail!("'{w}' groups are not supported yet (use devices or mirror)")
            }
            "" => bail!("empty device name"),
            _ => {}
        }
        let path = absolute(Path::new(w), cwd);
        if !seen.insert(path.clone()) {
            bail!("device {} is given more than once", path.display());
        }
        if in_mirror {
            if let Some(g) = groups.last_mut() {
                g.devices.push(path);
            }
        } else {
            groups.push(GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![path],
            });
        }
    }
    if groups.is_empty() {
        bail!("no devices given");
    }
    for (i, g) in groups.iter().enumerate() {
        if g.kind == GroupKind::Mirror && g.devices.len() < 2 {
            bail!(
                "mirror-{i} needs at least 2 devices, got {}",
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
                bail!(
                    "{} is part of exported pool '{}' (import it, destroy it, or use -f to overwrite)",
                    d.display(),
                    pool.name
                );
            }
        }
    }
    Ok(())
}

const POOL_COLUMNS: &[&str] = &[
    "name", "size", "alloc", "free", "cap", "health", "guid", "txg",
];

fn pool_column(c: &str) -> Option<&'static str> {
    let c = c.to_ascii_lowercase();
    let c = match c.as_str() {
        "allocated" => "alloc",
        "capacity" => "cap",
        other => POOL_COLUMNS.iter().copied().find(|k| *k == other)?,
    };
    Some(c)
}

fn pool_cell(p: &PoolSummary, col: &str, parsable: bool) -> String {
    let size = |n: u64| {
        if parsable {
            n.to_string()
        } else {
            human_size(n)
        }
    };
    match col {
        "name" => p.name.clone(),
        "size" => size(p.size),
        "alloc" => size(p.allocated),
        "free" => size(p.free),
        "cap" => {
            let pct = if p.size == 0 {
                0
            } else {
                (p.allocated as u128 * 100 / p.size as u128) as u64
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
        _ => "-".into(),
    }
}

/// The `pool list` table.
pub fn pool_table(pools: &[PoolSummary], columns: &[&str], parsable: bool) -> Table {
    let mut t = Table::new(columns);
    for (i, c) in columns.iter().enumerate() {
        if matches!(*c, "size" | "alloc" | "free" | "cap" | "txg") {
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
        None => vec!["name", "size", "alloc", "free", "cap", "health"],
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
        return match (&a.pool, statuses.first()) {
            (Some(_), Some(s)) => json(s),
            _ => json(&statuses),
        };
    }
    if statuses.is_empty() {
        outln("no pools available");
        return Ok(());
    }
    let text: Vec<String> = statuses.iter().map(render_status).collect();
    out(&text.join("\n"));
    Ok(())
}

/// zpool-status-style text for one pool.
pub fn render_status(s: &PoolStatus) -> String {
    let mut rows: Vec<(String, &str, [u64; 3])> = Vec::new();
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
                format!("  {}", d.path.display()),
                &d.state,
                [d.read_errors, d.write_errors, d.checksum_errors],
            ));
        } else {
            rows.push((
                format!("  {}", g.name),
                &g.state,
                sum(std::slice::from_ref(g)),
            ));
            for d in &g.devices {
                rows.push((
                    format!("    {}", d.path.display()),
                    &d.state,
                    [d.read_errors, d.write_errors, d.checksum_errors],
                ));
            }
        }
    }
    let mut t = Table::new(&["NAME", "STATE", "READ", "WRITE", "CKSUM"]);
    for i in 2..5 {
        t.align_right(i);
    }
    for (name, state, c) in rows {
        t.push(vec![
            name,
            state.to_string(),
            c[0].to_string(),
            c[1].to_string(),
            c[2].to_string(),
        ]);
    }
    let mut o = String::new();
    o.push_str(&format!("  pool: {}\n", s.summary.name));
    o.push_str(&format!(" state: {}\n", s.summary.health));
    o.push_str(&format!("   txg: {}\n", s.summary.txg));
    o.push_str("config:\n\n");
    for line in t.render(false).lines() {
        o.push('\t');
        o.push_str(line);
        o.push('\n');
    }
    o.push('\n');
    if s.errors.is_empty() {
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
            client.import_pool(&pool, &dirs)?;
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
    o.push_str(&format!(
        " action: cistern pool import {dir_args}{}\n",
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
        assert!(spec("raidz a b c")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
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
    fn status_tree() {
        let dev = |p: &str, cksum| DeviceStatus {
            path: p.into(),
            guid: 1,
            state: "ONLINE".into(),
            read_errors: 0,
            write_errors: 0,
            checksum_errors: cksum,
        };
        let s = PoolStatus {
            summary: summary("tank", 8 << 30, 0),
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
        };
        let text = render_status(&s);
        let expected = "  pool: tank\n state: ONLINE\n   txg: 9\nconfig:\n\n\
            \tNAME        STATE   READ  WRITE  CKSUM\n\
            \ttank        ONLINE     0      0      3\n\
            \t  mirror-0  ONLINE     0      0      3\n\
            \t    /d/a    ONLINE     0      0      1\n\
            \t    /d/b    ONLINE     0      0      2\n\
            \t  /d/c      ONLINE     0      0      0\n\
            \nerrors: No known data errors\n";
        assert_eq!(text, expected);
    }
}

//! `cistern quickstart`: the README's first command. Serves like `serve`, and
//! on first start makes a file-backed pool `tank` (a mirror of two sparse 8G
//! files under STATE_DIR/disks) with a 4G lz4-compressed volume `tank/vol0`.

use crate::config::{self, Config, Overrides};
use crate::serve::{self, Endpoints};
use anyhow::{Context, Result};
use clap::Args;
use dataset::{Engine, GroupKind, GroupSpec, PoolSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const POOL: &str = "tank";
pub const VOLUME: &str = "tank/vol0";
const DISK_SIZE: u64 = 8 << 30;
const VOLUME_SIZE: u64 = 4 << 30;

#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Directory for the daemon's state and the pool's device files.
    #[arg(long, value_name = "DIR", default_value = "./cistern-data")]
    pub state_dir: PathBuf,
    /// NBD listen address (default 127.0.0.1:10809).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<String>,
}

pub fn main(args: QuickstartArgs, api_flag: Option<String>) -> Result<()> {
    let state_dir = std::path::absolute(&args.state_dir)
        .with_context(|| format!("bad state directory {}", args.state_dir.display()))?;
    let resolved = config::resolve(
        Config::default(),
        Overrides {
            state_dir: Some(state_dir.clone()),
            nbd: args.nbd,
            api: api_flag,
        },
        None,
    )?;
    let disks = state_dir.join("disks");
    serve::run(
        resolved,
        Some(Box::new(move |e: &Arc<Engine>| setup(e, &disks))),
        Some(Box::new(announce)),
    )
}

/// Makes sure pool `tank` is imported, creating it (and `tank/vol0`) the first time.
pub fn setup(engine: &Engine, disks: &Path) -> Result<()> {
    if engine.list_pools().iter().any(|p| p.name == POOL) {
        return Ok(());
    }
    let devices: Vec<PathBuf> = ["d0", "d1"].iter().map(|d| disks.join(d)).collect();
    if devices.iter().any(|d| d.exists()) {
        let found = engine
            .importable_pools(&[disks.to_path_buf()])
            .with_context(|| format!("cannot search {} for pools", disks.display()))?;
        if found.iter().any(|p| p.name == POOL) {
            tracing::info!("importing pool {POOL} from {}", disks.display());
            engine
                .import_pool(POOL, &[disks.to_path_buf()], false)
                .with_context(|| format!("cannot import pool {POOL}"))?;
            return Ok(());
        }
    }
    std::fs::create_dir_all(disks).with_context(|| format!("cannot create {}", disks.display()))?;
    tracing::info!(
        "creating pool {POOL}: mirror of {} sparse files in {}",
        devices.len(),
        disks.display()
    );
    let spec = PoolSpec {
        name: POOL.into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Mirror,
            devices,
        }],
        create_size: Some(DISK_SIZE),
        force: false,
    };
    engine
        .create_pool(spec)
        .with_context(|| format!("cannot create pool {POOL}"))?;
    engine
        .create_volume(VOLUME, VOLUME_SIZE, &[("compression".into(), "lz4".into())])
        .with_context(|| format!("cannot create volume {VOLUME}"))?;
    Ok(())
}

fn announce(engine: &Arc<Engine>, ep: &Endpoints) {
    let mut names = engine.volume_names();
    names.sort();
    if names.is_empty() {
        println!("No volumes yet: cistern create -V 4G {POOL}/vol1");
    }
    for n in &names {
        println!("Volume {n}: {}", ep.nbd_uri(n));
    }
    if let Some(first) = names.first() {
        println!("Try: nbdinfo {}", ep.nbd_uri(first));
    }
    let api = if ep.api_url() == api::DEFAULT_API_URL {
        String::new()
    } else {
        format!("CISTERN_API={} ", ep.api_url())
    };
    println!("Manage: {api}{} list", invocation());
    println!("Stop with Ctrl-C.");
}

/// How the user can run this binary from where they stand: `cistern` if
/// that is what their PATH finds, else its path (relative to the current
/// directory when below it, e.g. `./target/release/cistern` after `cargo run`).
fn invocation() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "cistern".into();
    };
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .any(|dir| std::fs::canonicalize(dir.join("cistern")).is_ok_and(|found| found == exe))
    });
    if on_path {
        return "cistern".into();
    }
    match std::env::current_dir()
        .ok()
        .and_then(|cwd| exe.strip_prefix(cwd).ok().map(|p| p.to_path_buf()))
    {
        Some(rel) => format!("./{}", rel.display()),
        None => exe.display().to_string(),
    }
}

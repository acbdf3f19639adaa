//! `cistern quickstart`: the README's first command. Serves like `serve`
//! (S3 included), and on first start makes a file-backed pool `tank` (a
//! mirror of two sparse 8G files under STATE_DIR/disks) with a 4G
//! lz4-compressed volume `tank/vol0`, a bucket `tank/bucket0` and an S3 user
//! `quickstart` that may read and write it (its secret printed this once),
//! and a filesystem `tank/fs0` mounted at STATE_DIR/fs0 and shared over NFS
//! and SMB.

use crate::config::{self, Config, Overrides};
use crate::serve::{self, Endpoints};
use anyhow::{Context, Result};
use clap::Args;
use dataset::{Engine, GroupKind, GroupSpec, PoolSpec};
use s3::access::{Access, Grant, NewUser, Users};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const POOL: &str = "tank";
pub const VOLUME: &str = "tank/vol0";
/// The bucket's dataset; its S3 name is the last component (the S3 parent is `tank`).
pub const BUCKET: &str = "tank/bucket0";
pub const S3_BUCKET: &str = "bucket0";
/// The filesystem, mounted under the state directory.
pub const FILESYSTEM: &str = "tank/fs0";
/// The S3 user made on first start.
pub const S3_USER: &str = "quickstart";
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
    /// S3 listen address (default 127.0.0.1:10811).
    #[arg(long, value_name = "ADDR")]
    pub s3: Option<String>,
    /// NFS listen address, MOUNT on the same port (default 127.0.0.1:10812).
    #[arg(long, value_name = "ADDR")]
    pub nfs: Option<String>,
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
            s3: args.s3,
            s3_by_default: true,
            nfs: args.nfs,
            nfs_by_default: true,
            insecure: false,
        },
        None,
    )?;
    let disks = state_dir.join("disks");
    let state_dir_fs = state_dir.join("fs0");
    // The key made at setup, for the announcement (printed once).
    let made: Arc<Mutex<Option<NewUser>>> = Arc::default();
    let made2 = made.clone();
    serve::run(
        resolved,
        Some(Box::new(move |e: &Arc<Engine>, u: &Arc<Users>| {
            let created = setup(e, &disks)?;
            setup_fs(e, &state_dir_fs)?;
            if created {
                let user = setup_s3(e, u)?;
                *made2.lock().unwrap_or_else(|p| p.into_inner()) = Some(user);
            }
            Ok(())
        })),
        Some(Box::new(move |e: &Arc<Engine>, ep: &Endpoints| {
            let user = made.lock().unwrap_or_else(|p| p.into_inner()).take();
            announce(e, ep, user)
        })),
    )
}

/// First start: the bucket and a user with rw on it. The bucket needs the
/// object layer; without it quickstart still serves (and says so), and an S3
/// CreateBucket by that user makes it later.
fn setup_s3(engine: &Engine, users: &Users) -> Result<NewUser> {
    if let Err(e) = engine.create_dataset(
        BUCKET,
        dataset::DatasetKind::Bucket,
        &[("compression".into(), "lz4".into())],
    ) {
        tracing::warn!("cannot create bucket {BUCKET}: {e}");
    }
    let grant = Grant {
        bucket: S3_BUCKET.into(),
        access: Access::Write,
    };
    users
        .add(S3_USER, &[grant])
        .with_context(|| format!("cannot add S3 user {S3_USER}"))
}

/// The filesystem, made once (also on a state directory from an earlier
/// build that had none): lz4, mounted at `mountpoint`, shared over NFS and SMB.
fn setup_fs(engine: &Engine, mountpoint: &Path) -> Result<()> {
    if engine.dataset(FILESYSTEM).is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(mountpoint)
        .with_context(|| format!("cannot create {}", mountpoint.display()))?;
    engine
        .create_dataset(
            FILESYSTEM,
            dataset::DatasetKind::Filesystem,
            &[
                ("compression".into(), "lz4".into()),
                ("mountpoint".into(), mountpoint.display().to_string()),
                ("sharenfs".into(), "on".into()),
                ("sharesmb".into(), "on".into()),
            ],
        )
        .with_context(|| format!("cannot create filesystem {FILESYSTEM}"))?;
    Ok(())
}

/// Makes sure pool `tank` is imported, creating it (and `tank/vol0`) the
/// first time; true when it was created now.
pub fn setup(engine: &Engine, disks: &Path) -> Result<bool> {
    if engine.list_pools().iter().any(|p| p.name == POOL) {
        return Ok(false);
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
            return Ok(false);
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
    Ok(true)
}

fn announce(engine: &Arc<Engine>, ep: &Endpoints, user: Option<NewUser>) {
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
    if let Ok(fs) = engine.dataset(FILESYSTEM) {
        if let Some(mp) = fs.property("mountpoint") {
            println!("Filesystem {FILESYSTEM}: mounted at {} (FUSE)", mp.value);
        }
        if let Some(url) = ep.nfs_url(FILESYSTEM) {
            println!("NFS: {url}  (try: nfs-ls '{url}')");
        }
        if let Some(smb) = ep.smb {
            let share = FILESYSTEM.replace('/', "_");
            println!(
                "SMB: //{}/{share} port {}  (an account first: smbpasswd -c {} -a USER; then: smbclient //{}/{share} -p {} -U USER)",
                smb.ip(),
                smb.port(),
                ep.state_dir.join("smb").join("smb.conf").display(),
                smb.ip(),
                smb.port()
            );
        }
    }
    if let Some(url) = ep.s3_url() {
        println!("S3 bucket {S3_BUCKET} ({BUCKET}): {url}/{S3_BUCKET}");
        match user {
            Some(u) => {
                println!("S3 access key id:     {}", u.access_key);
                println!("S3 secret access key: {}  (shown this once)", u.secret_key);
                println!(
                    "Try: AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={} aws --endpoint-url {url} s3 ls s3://{S3_BUCKET}",
                    u.access_key, u.secret_key
                );
            }
            None => println!(
                "S3 keys: user '{S3_USER}''s key was printed at the first start; a new one: {api}{} user add NAME --grant {S3_BUCKET}=rw",
                invocation()
            ),
        }
    }
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

//! `cistern mount` and `cistern unmount`/`umount`: FUSE mounts of
//! filesystems, made by the daemon (as `zfs mount`/`zfs unmount`).

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Mount every filesystem that has a mountpoint and is not mounted.
    #[arg(short = 'a')]
    pub all: bool,
    /// Print JSON (the listing).
    #[arg(long)]
    pub json: bool,
    /// POOL/FS (none: list what is mounted).
    pub dataset: Option<String>,
    /// Where (default: its `mountpoint` property).
    pub dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct UnmountArgs {
    /// Unmount every mounted filesystem.
    #[arg(short = 'a')]
    pub all: bool,
    /// Even with files open there (they see errors from then on).
    #[arg(short = 'f')]
    pub force: bool,
    /// POOL/FS or its mount directory.
    pub target: Option<String>,
}

pub fn mount(client: &api::Client, a: MountArgs) -> Result<()> {
    match (a.all, a.dataset) {
        (false, None) => {
            let list = client.mounts()?;
            if a.json {
                return crate::output::json(&list);
            }
            // As `zfs mount`: dataset and directory, one a line.
            let mut t = crate::format::Table::new(&["NAME", "MOUNTPOINT"]);
            for m in list {
                t.push(vec![m.dataset, m.mountpoint.display().to_string()]);
            }
            crate::output::out(&t.render(true));
            Ok(())
        }
        (true, Some(_)) => bail!("-a mounts every filesystem: give no dataset with it"),
        (true, None) => {
            client.mount(&api::MountRequest {
                all: true,
                ..Default::default()
            })?;
            Ok(())
        }
        (false, Some(ds)) => {
            let dir = match a.dir {
                Some(d) => Some(
                    std::path::absolute(&d)
                        .with_context(|| format!("cannot mount '{ds}' on '{}'", d.display()))?,
                ),
                None => None,
            };
            client.mount(&api::MountRequest {
                dataset: Some(ds),
                dir,
                all: false,
            })?;
            Ok(())
        }
    }
}

pub fn unmount(client: &api::Client, a: UnmountArgs) -> Result<()> {
    let target = match (a.all, a.target) {
        (true, Some(_)) => bail!("-a unmounts every filesystem: give no target with it"),
        (false, None) => bail!("give a filesystem or a directory to unmount, or -a"),
        (_, t) => t.map(|t| {
            // A directory: as the daemon knows it (absolute, no trailing '/').
            if t.starts_with('/') || t.starts_with('.') {
                let p = std::path::absolute(&t).unwrap_or_else(|_| PathBuf::from(&t));
                let s = p.to_string_lossy().into_owned();
                let s = s.trim_end_matches('/');
                if s.is_empty() {
                    "/".to_string()
                } else {
                    s.to_string()
                }
            } else {
                t
            }
        }),
    };
    client.unmount(&api::UnmountRequest {
        target,
        force: a.force,
        all: a.all,
    })?;
    Ok(())
}

//! The client commands: each talks to the daemon through [`api::Client`].

pub mod dataset;
pub mod iostat;
pub mod key;
pub mod mount;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod props;
pub mod replication;
pub mod send;
pub mod share;
pub mod snapshot;
pub mod user;

use crate::Command;
use anyhow::Result;

/// `-H`, `-p` and `--json`, shared by every listing command as in zfs/zpool.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct OutputFlags {
    /// Scripted mode: no header, fields separated by tabs.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Exact numbers instead of human-readable values.
    #[arg(short = 'p')]
    pub parsable: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(client: &api::Client, command: Command) -> Result<()> {
    match command {
        Command::Pool(c) => pool::run(client, c),
        Command::Create(a) => dataset::create(client, a),
        Command::List(a) => dataset::list(client, a),
        Command::Get(a) => dataset::get(client, a),
        Command::Set(a) => dataset::set(client, a),
        Command::Destroy(a) => dataset::destroy(client, a),
        Command::Rename(a) => dataset::rename(client, a),
        Command::Inherit(a) => dataset::inherit(client, a),
        Command::LoadKey(a) => key::load_key(client, a),
        Command::UnloadKey(a) => key::unload_key(client, a),
        Command::ChangeKey(a) => key::change_key(client, a),
        Command::Share(a) => share::share(client, a),
        Command::Unshare(a) => share::unshare(client, a),
        Command::Version => version(client),
        Command::Snapshot(a) => snapshot::snapshot(client, a),
        Command::Rollback(a) => snapshot::rollback(client, a),
        Command::Clone(a) => snapshot::clone(client, a),
        Command::Promote(a) => snapshot::promote(client, a),
        Command::Hold(a) => snapshot::hold(client, a, true),
        Command::Release(a) => snapshot::hold(client, a, false),
        Command::Holds(a) => snapshot::holds(client, a),
        Command::Diff(a) => snapshot::diff(client, a),
        Command::Bookmark(a) => send::bookmark(client, a),
        Command::Send(a) => send::send(client, a),
        Command::Receive(a) => send::receive(client, a),
        Command::Mount(a) => mount::mount(client, a),
        Command::Unmount(a) => mount::unmount(client, a),
        Command::Policy(c) => policy::run(client, c),
        Command::User(c) => user::run(client, c),
        Command::Replication(c) => replication::run(client, c),
        Command::Serve(_) | Command::Quickstart(_) | Command::Bench(_) => {
            unreachable!("daemon commands are dispatched in main")
        }
    }
}

/// `cistern version`: this program's version, and the daemon's when one
/// answers (as `zfs version` prints the userland and the kernel module's).
fn version(client: &api::Client) -> Result<()> {
    crate::output::outln(&format!("cistern-{}", env!("CARGO_PKG_VERSION")));
    let quick = client.with_call_timeout(std::time::Duration::from_secs(5));
    match quick.health() {
        Ok(h) => crate::output::outln(&format!("cistern-daemon-{}", h.version)),
        Err(e) => tracing::info!("no daemon version: {e}"),
    }
    Ok(())
}

/// Splits `a,b,,c` into trimmed non-empty parts.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// clap value parser for sizes: `-V 10G`, `-s 8G`.
pub fn size_arg(s: &str) -> Result<u64, String> {
    crate::format::parse_size(s).map_err(|e| e.to_string())
}

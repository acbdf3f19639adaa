//! `cistern`: the daemon (`serve`, `quickstart`) and the zpool/zfs-style CLI
//! that talks to it over the management API.

mod cmd;
mod exposure;
use cistern::config;
mod format;
mod malloc_tuning;
mod nbd_adapter;
mod nbd_metrics;
mod output;
mod quickstart;
mod serve;
mod shares;
mod standby;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "cistern",
    version,
    about = "A checksummed, copy-on-write storage server in user space"
)]
pub struct Cli {
    /// Daemon API URL [env: CISTERN_API] [default: http://127.0.0.1:10810];
    /// for serve/quickstart the address to listen on
    #[arg(verbatim_doc_comment)]
    #[arg(
        long,
        global = true,
        env = "CISTERN_API",
        value_name = "URL",
        hide_env = true
    )]
    pub api: Option<String>,

    /// The daemon's API token [env: CISTERN_TOKEN]; by default the one a
    /// daemon of this user on this machine left in its runtime directory
    #[arg(verbatim_doc_comment)]
    #[arg(
        long,
        global = true,
        env = "CISTERN_TOKEN",
        value_name = "TOKEN",
        hide_env = true,
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// PEM file of the CA an https:// daemon's certificate must chain to
    /// [env: CISTERN_CA] (default: the system's CA bundle)
    #[arg(verbatim_doc_comment)]
    #[arg(
        long,
        global = true,
        env = "CISTERN_CA",
        value_name = "FILE",
        hide_env = true
    )]
    pub ca: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: NBD server and management API over the pools in STATE_DIR.
    Serve(serve::ServeArgs),
    /// Run the daemon with a ready file-backed pool `tank` and volume `tank/vol0`.
    Quickstart(quickstart::QuickstartArgs),
    /// Manage pools (create, list, status, destroy, export, import).
    #[command(subcommand)]
    Pool(cmd::pool::PoolCommand),
    /// Create a filesystem (`cistern create [-o prop=value]... POOL/FS`), a volume
    /// (`cistern create -V 10G POOL/VOL`) or a bucket (`cistern create -t bucket POOL/NAME`).
    Create(cmd::dataset::CreateArgs),
    /// List datasets and their space.
    List(cmd::dataset::ListArgs),
    /// Show properties of datasets.
    Get(cmd::dataset::GetArgs),
    /// Set a property: `cistern set compression=lz4 tank/vol0`.
    Set(cmd::dataset::SetArgs),
    /// Destroy a dataset or snapshots: `cistern destroy [-rRnv] POOL/DS[@SNAP[%SNAP]]`.
    Destroy(cmd::dataset::DestroyArgs),
    /// Rename a dataset or snapshot: `cistern rename [-r] FROM TO`.
    Rename(cmd::dataset::RenameArgs),
    /// Stop setting a property locally (inherit it again): `cistern inherit [-r] PROP DS...`.
    Inherit(cmd::dataset::InheritArgs),
    /// Load an encryption root's key: `cistern load-key [-n] [-L keylocation] -a | POOL/DS`
    /// (keylocation=prompt: the key is read from standard input).
    LoadKey(cmd::key::LoadKeyArgs),
    /// Forget an encryption root's key (refused while its datasets are served): `cistern unload-key -a | POOL/DS`.
    UnloadKey(cmd::key::UnloadKeyArgs),
    /// Rewrap an encryption root's master key under a new key (no data is rewritten):
    /// `cistern change-key [-l] [-o keyformat=..] [-o keylocation=..] POOL/DS`.
    ChangeKey(cmd::key::ChangeKeyArgs),
    /// Share filesystems whose sharesmb/sharenfs ask for it: `cistern share -a | FILESYSTEM`.
    Share(cmd::share::ShareArgs),
    /// Take shares down until `share` or a restart: `cistern unshare -a | FILESYSTEM`.
    Unshare(cmd::share::ShareArgs),
    /// Print the version of this program and of the daemon.
    Version,
    /// Take snapshots: `cistern snapshot [-r] POOL/DS@NAME...`.
    Snapshot(cmd::snapshot::SnapshotArgs),
    /// Roll a dataset back to a snapshot: `cistern rollback [-r] POOL/DS@NAME`.
    Rollback(cmd::snapshot::RollbackArgs),
    /// Create a writable clone of a snapshot: `cistern clone POOL/DS@NAME POOL/NEW`.
    Clone(cmd::snapshot::CloneArgs),
    /// Make a clone independent of its origin: `cistern promote POOL/CLONE`.
    Promote(cmd::snapshot::PromoteArgs),
    /// Put a hold on snapshots (a held snapshot cannot be destroyed).
    Hold(cmd::snapshot::HoldArgs),
    /// Release a hold.
    Release(cmd::snapshot::HoldArgs),
    /// List the holds on snapshots.
    Holds(cmd::snapshot::HoldsArgs),
    /// Keep a snapshot's point in time as a bookmark (an incremental send's
    /// source after the snapshot is gone): `cistern bookmark POOL/DS@SNAP POOL/DS#NAME`.
    Bookmark(cmd::send::BookmarkArgs),
    /// Changed block ranges between a snapshot and a later one or the dataset now.
    Diff(cmd::snapshot::DiffArgs),
    /// Write a snapshot as a stream to standard output:
    /// `cistern send [-i|-I FROM] [-R] [-w] [-nvP] POOL/DS@SNAP > FILE`.
    Send(cmd::send::SendArgs),
    /// Create a snapshot from a stream on standard input:
    /// `cistern receive [-F] [-s] [-v] POOL/DS < FILE`; `-A POOL/DS` aborts.
    #[command(visible_alias = "recv")]
    Receive(cmd::send::ReceiveArgs),
    /// Mount a filesystem through FUSE (`cistern mount POOL/FS [DIR]`, `-a`); no
    /// arguments: list the mounts.
    Mount(cmd::mount::MountArgs),
    /// Unmount a filesystem: `cistern unmount [-f] POOL/FS|DIR` (or `-a`).
    #[command(visible_alias = "umount")]
    Unmount(cmd::mount::UnmountArgs),
    /// S3 access keys and their grants: add, list, remove, grant, revoke.
    #[command(subcommand)]
    User(cmd::user::UserCommand),
    /// Snapshot policies: list, show, run [-n], history.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCommand),
    /// Replication jobs to or from another Cistern daemon: add, list, status, run, remove, pause, resume.
    #[command(subcommand)]
    Replication(cmd::replication::ReplicationCommand),
    /// Measure and size storage: iops, latency, provisioning, compression.
    #[command(subcommand)]
    Bench(bench::cli::BenchCommand),
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Command::List(a) = &mut cli.command {
        a.order_sort_keys(matches.subcommand_matches("list"));
    }
    // The daemon listens where the command line or its config says; the
    // environment's CISTERN_API is only where clients look.
    let api_flag = match matches.value_source("api") {
        Some(ValueSource::CommandLine) => cli.api.clone(),
        _ => None,
    };
    let result = match cli.command {
        Command::Serve(args) => {
            malloc_tuning::reexec_daemon();
            serve::main(args, api_flag)
        }
        Command::Quickstart(args) => {
            malloc_tuning::reexec_daemon();
            quickstart::main(args, api_flag)
        }
        Command::Bench(cmd) => bench::cli::run(cmd),
        command => {
            output::init_client_logging();
            let mut client = api::Client::new(cli.api.as_deref().unwrap_or(api::DEFAULT_API_URL))
                .with_caller(cmd::pool::caller());
            if let Some(t) = cli.token.clone() {
                client = client.with_token(t);
            }
            match &cli.ca {
                Some(ca) => client.with_ca(ca).map_err(anyhow::Error::from),
                None => Ok(client),
            }
            .and_then(|client| cmd::run(&client, command))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::error(&e);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn api_source(args: &[&str]) -> (Option<String>, Option<ValueSource>) {
        let m = Cli::command().try_get_matches_from(args).unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        (cli.api, m.value_source("api"))
    }

    #[test]
    fn global_api_flag_works_before_and_after_the_subcommand() {
        let (api, src) = api_source(&["cistern", "--api", "http://h:1", "list"]);
        assert_eq!(api.as_deref(), Some("http://h:1"));
        assert_eq!(src, Some(ValueSource::CommandLine));
        let (api, src) = api_source(&[
            "cistern",
            "serve",
            "--state-dir",
            "/s",
            "--api",
            "127.0.0.1:5",
        ]);
        assert_eq!(api.as_deref(), Some("127.0.0.1:5"));
        assert_eq!(src, Some(ValueSource::CommandLine));
    }

    #[test]
    fn send_t_is_the_resume_token_not_the_api_token() {
        let cli = Cli::try_parse_from(["cistern", "send", "-t", "1-ab"]).unwrap();
        assert_eq!(cli.token, None);
        match cli.command {
            Command::Send(a) => assert_eq!(a.resume_token.as_deref(), Some("1-ab")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_zfs_style_commands() {
        let m = Cli::try_parse_from([
            "cistern",
            "create",
            "-V",
            "1.5G",
            "-o",
            "compression=lz4",
            "-o",
            "volblocksize=16K",
            "tank/v",
        ])
        .unwrap();
        match m.command {
            Command::Create(a) => {
                assert_eq!(a.volsize, Some(3 << 29));
                assert_eq!(a.props.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        let e = Cli::try_parse_from(["cistern", "create", "-V", "10X", "tank/v"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("'10X'"), "{e}");
        assert!(Cli::try_parse_from([
            "cistern", "pool", "create", "-s", "8G", "-f", "tank", "mirror", "a", "b"
        ])
        .is_ok());
        assert!(Cli::try_parse_from([
            "cistern",
            "list",
            "-H",
            "-p",
            "-o",
            "name,used",
            "-t",
            "volume",
            "-r",
            "tank"
        ])
        .is_ok());
        assert!(Cli::try_parse_from([
            "cistern", "get", "-H", "-p", "-o", "value", "all", "tank", "tank/v"
        ])
        .is_ok());
        assert!(
            Cli::try_parse_from(["cistern", "pool", "import", "-d", "a", "-d", "b", "tank"])
                .is_ok()
        );
    }
}

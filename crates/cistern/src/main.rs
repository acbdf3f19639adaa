//! `cistern`: the daemon (`serve`, `quickstart`) and the zpool/zfs-style CLI
//! that talks to it over the management API.

mod cmd;
mod config;
mod format;
mod nbd_adapter;
mod nbd_metrics;
mod output;
mod quickstart;
mod serve;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "cistern",
    version,
    about = "A checksummed, copy-on-write storage server in user space"
)]
#[command(propagate_version = true, disable_help_subcommand = true)]
pub struct Cli {
    /// Management API: the URL commands talk to [env: CISTERN_API; default: http://127.0.0.1:10810].
    /// For `serve`/`quickstart`: the address to listen on (default 127.0.0.1:10810).
    #[arg(
        long,
        global = true,
        env = "CISTERN_API",
        value_name = "URL",
        hide_env = true
    )]
    pub api: Option<String>,

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
    /// Create a volume: `cistern create -V 10G [-o prop=value]... POOL/VOL`.
    Create(cmd::dataset::CreateArgs),
    /// List datasets and their space.
    List(cmd::dataset::ListArgs),
    /// Show properties of datasets.
    Get(cmd::dataset::GetArgs),
    /// Set a property: `cistern set compression=lz4 tank/vol0`.
    Set(cmd::dataset::SetArgs),
    /// Destroy a dataset.
    Destroy(cmd::dataset::DestroyArgs),
    // Further subcommands delegate in one line each, e.g.
    // `Bench(bench::cli::Args)` dispatched as `Command::Bench(a) => bench::cli::run(a)`.
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // The daemon listens where the command line or its config says; the
    // environment's CISTERN_API is only where clients look.
    let api_flag = match matches.value_source("api") {
        Some(ValueSource::CommandLine) => cli.api.clone(),
        _ => None,
    };
    let result = match cli.command {
        Command::Serve(args) => serve::main(args, api_flag),
        Command::Quickstart(args) => quickstart::main(args, api_flag),
        command => {
            output::init_client_logging();
            let client = api::Client::new(cli.api.as_deref().unwrap_or(api::DEFAULT_API_URL));
            cmd::run(&client, command)
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

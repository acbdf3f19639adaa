//! Stand-alone `bench` for trying the subcommands before the `cistern`
//! binary wires them in: `cargo run -p bench --example bench -- iops /tmp/x -d 5s`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "cistern-bench", about = "cistern bench, stand-alone")]
struct Cli {
    #[command(subcommand)]
    cmd: bench::cli::BenchCommand,
}

fn main() -> anyhow::Result<()> {
    bench::cli::run(Cli::parse().cmd)
}

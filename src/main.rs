//! The `cloakd` binary: parses the command line, sets up logging and calls into the library. The
//! load tools (`simulate`, `soak`, `publish-load`) and the reference provider's process
//! (`provider`) are commands of this binary only: their modules (files under `src/cli/`) are
//! declared here, so they are no part of the library's surface (the provider itself is the
//! library's `provider` module).
use std::process::ExitCode;

use clap::{Parser, Subcommand};
// The load tools name the library's modules as `crate::...`.
use cloakd::{daemon, data_files, location, plots, poi, proto, provider};

/// The binary's own commands, beside the library's (`cloakd::cli`).
mod cli {
    pub mod provider;
    pub mod publish_load;
    pub mod simulate;
    pub mod soak;
}

#[derive(Debug, Parser)]
#[command(
    name = "cloakd",
    version,
    about = "A privacy broker: k-anonymous location cloaking, rho-uncertain transaction streams and batch table anonymization"
)]
struct Cli {
    #[command(flatten)]
    log: cloakd::cli::LogArgs,
    #[command(subcommand)]
    command: Command,
}

// One value per process, parsed once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Library(cloakd::cli::Command),
    /// Replay a mobility trace against a running daemon as many clients plus an LBS provider, and
    /// report success rate, anonymity, resolution, throughput and latency.
    Simulate(cli::simulate::SimulateArgs),
    /// Hold many concurrent streams (Submit, Publish, ReleaseFeed, a provider) against a running
    /// daemon for a while; report stream failures by code and the daemon's RSS and threads (--pid).
    Soak(cli::soak::SoakArgs),
    /// Publish records as fast as a daemon (or several replicas) acknowledges them; report records/s
    /// and, with --pid, CPU seconds per record of each process.
    PublishLoad(cli::publish_load::PublishLoadArgs),
    /// The reference LBS provider of points of interest: subscribes to a service of a running broker
    /// and answers each cloaked `PoiQuery` with the candidate list of its box (docs/provider.md).
    Provider(cli::provider::ProviderArgs),
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Library(command) => cloakd::cli::run(command),
        Command::Simulate(args) => cli::simulate::run(args),
        Command::Soak(args) => cli::soak::run(args),
        Command::PublishLoad(args) => cli::publish_load::run(args),
        Command::Provider(args) => cli::provider::run(args),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = cloakd::cli::init_tracing(&cli.log) {
        eprintln!("cloakd: {err:#}");
        return ExitCode::FAILURE;
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cloakd: {err:#}");
            ExitCode::FAILURE
        }
    }
}

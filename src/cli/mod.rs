//! Command line: `cloakd serve`, `cloakd simulate`, `cloakd table ...`, `cloakd transactions ...`.
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cloakd",
    version,
    about = "A privacy broker: k-anonymous location cloaking, rho-uncertain transaction streams and batch table anonymization"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve,
}

/// Logging to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve => Ok(()),
    }
}

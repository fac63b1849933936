//! The `cloakd` binary: parses the command line, sets up logging and calls into the library.
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cloakd::cli::Cli::parse();
    if let Err(err) = cloakd::cli::init_tracing(&cli.log) {
        eprintln!("cloakd: {err:#}");
        return ExitCode::FAILURE;
    }
    match cloakd::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cloakd: {err:#}");
            ExitCode::FAILURE
        }
    }
}

//! `cloakd table`: the batch relational commands on files, each in its module (`anonymize`,
//! `evaluate`, `frontier`, `figures`, `risk`, and a hidden `synth`), dispatched here.
pub mod anonymize;
pub mod evaluate;
pub mod figures;
pub mod frontier;
pub mod input;
pub mod risk;
pub mod risk_options;
pub mod synth;

use clap::Subcommand;

use anonymize::{AnonymizeArgs, anonymize};
use synth::{SynthArgs, synth};

#[derive(Debug, clap::Args)]
pub struct TableArgs {
    #[command(subcommand)]
    pub command: TableCommand,
}

#[derive(Debug, Subcommand)]
pub enum TableCommand {
    /// Anonymize a table as a job file describes (flags override the job).
    Anonymize(AnonymizeArgs),
    /// Write a synthetic table with the Adult examples' schema (for benchmarks).
    #[command(hide = true)]
    Synth(SynthArgs),
    /// Measure a release against its original table: Ploss, Uloss, A_know, A_acc, query error.
    Evaluate(evaluate::EvaluateArgs),
    /// Sweep privacy models and parameters, measure each release, plot the efficient frontier.
    Frontier(frontier::FrontierArgs),
    /// Brickell & Shmatikov's Figures 1-4: the adversary's and the researcher's gains per sanitization.
    Figures(figures::FiguresArgs),
    /// Re-identification risk of a table or a release: prosecutor, journalist, marketer,
    /// uniqueness, population uniqueness, SUDA.
    Risk(risk::RiskArgs),
}

pub fn run(args: TableArgs) -> anyhow::Result<()> {
    match args.command {
        TableCommand::Anonymize(a) => anonymize(a),
        TableCommand::Synth(a) => synth(a),
        TableCommand::Evaluate(a) => evaluate::run(a),
        TableCommand::Frontier(a) => frontier::run(a),
        TableCommand::Figures(a) => figures::run(a),
        TableCommand::Risk(a) => risk::run(a),
    }
}

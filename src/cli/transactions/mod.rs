//! `cloakd transactions ...`: batch anonymization of set-valued records with personalized
//! rho-uncertainty ([`crate::transactions`]) and generation of "personalized+" sensitive constraints.
//!
//! Files ([`item_sets`]): one record per line, items separated by whitespace (any string;
//! interned to dense ids); `.gz` is read and written transparently. The constraints file has line i = the sensitive items of
//! record i (possibly empty), so it must have exactly as many lines as the records file. Outputs are
//! written to a temporary file beside the target and renamed into place, so a failed run never
//! leaves a partial file. Bad input is refused with `file:line: rule`.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

mod error;
mod item_sets;

use crate::transactions::{
    ItemId, Mode, Params, PersonalizedPlus, Record, UtilityReport, anonymize,
};
pub use error::TransactionsCliError;
use item_sets::{ItemNames, io_error, read_item_sets, write_item_sets};

#[derive(Debug, Args)]
pub struct TransactionsArgs {
    #[command(subcommand)]
    pub command: TransactionsCommand,
}

#[derive(Debug, Subcommand)]
pub enum TransactionsCommand {
    /// Anonymize a file of records by partial suppression (personalized rho^m-uncertainty).
    Anonymize(AnonymizeArgs),
    /// Generate "personalized+" sensitive constraints for a file of records.
    Constraints(ConstraintsArgs),
}

#[derive(Debug, Args)]
pub struct AnonymizeArgs {
    /// Records: one per line, space-separated items (`.gz` read transparently).
    #[arg(long, value_name = "RECORDS")]
    pub input: PathBuf,
    /// Sensitive constraints: line i = the sensitive items of record i (may be empty).
    #[arg(long, value_name = "CONSTRAINTS")]
    pub sensitive: PathBuf,
    /// Largest confidence a released rule Q → e may have, in (0, 1).
    #[arg(long)]
    pub rho: f64,
    /// Largest adversary knowledge |Q|, >= 1.
    #[arg(long)]
    pub m: u32,
    /// (eps, delta)-rho^m-uncertainty with sampled adversaries instead of every adversary.
    #[arg(long)]
    pub sampled: bool,
    /// Sampled mode: eps in (0, 1).
    #[arg(long, required_if_eq("sampled", "true"))]
    pub epsilon: Option<f64>,
    /// Sampled mode: delta in (0, 1).
    #[arg(long, required_if_eq("sampled", "true"))]
    pub delta: Option<f64>,
    /// Seed of every random choice (suppressed records, sampled adversaries, output order).
    #[arg(long)]
    pub seed: u64,
    /// Released records, one per line (an empty line when every item was suppressed).
    #[arg(long, value_name = "OUT")]
    pub output: PathBuf,
    /// Keep the input order (for evaluation) instead of shuffling the released records.
    #[arg(long)]
    pub keep_order: bool,
    /// Write the utility report as JSON here.
    #[arg(long, value_name = "REPORT")]
    pub report: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConstraintsArgs {
    /// Records: one per line, space-separated items (`.gz` read transparently).
    #[arg(long, value_name = "RECORDS")]
    pub input: PathBuf,
    /// Fraction of the items that tend to be sensitive, in [0, 1].
    #[arg(long)]
    pub sensitive_share: f64,
    #[arg(long)]
    pub seed: u64,
    /// Constraints file to write (line i = sensitive items of record i).
    #[arg(long, value_name = "CONSTRAINTS")]
    pub output: PathBuf,
}

/// The JSON report of `cloakd transactions anonymize`.
#[derive(Debug, serde::Serialize)]
struct BatchReport<'a> {
    #[serde(flatten)]
    report: &'a UtilityReport,
    /// Wall-clock seconds of the whole command (reading, anonymizing, writing).
    total_seconds: f64,
    input: String,
    sensitive: String,
}

fn progress(message: &'static str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub fn run(args: TransactionsArgs) -> anyhow::Result<()> {
    match args.command {
        TransactionsCommand::Anonymize(args) => {
            run_anonymize(&args)?;
        }
        TransactionsCommand::Constraints(args) => run_constraints(&args)?,
    }
    Ok(())
}

fn run_anonymize(args: &AnonymizeArgs) -> Result<UtilityReport, TransactionsCliError> {
    let started = Instant::now();
    let mode = if args.sampled {
        Mode::Sampled {
            epsilon: args.epsilon.unwrap_or(f64::NAN),
            delta: args.delta.unwrap_or(f64::NAN),
        }
    } else {
        Mode::Exact
    };
    let params = Params {
        rho: args.rho,
        m: args.m,
        mode,
    };
    let input = args.input.display().to_string();
    let engine_error = |source| TransactionsCliError::Engine {
        input: input.clone(),
        source,
    };
    // Refuse bad parameters before reading anything.
    anonymize(&[], &params, args.seed).map_err(engine_error)?;

    let spinner = progress("reading records");
    let mut names = ItemNames::default();
    let records = read_item_sets(&args.input, &mut names, false)?;
    spinner.set_message("reading constraints");
    let constraints = read_item_sets(&args.sensitive, &mut names, true)?;
    if constraints.len() != records.len() {
        return Err(TransactionsCliError::LineCountMismatch {
            sensitive: args.sensitive.display().to_string(),
            constraint_lines: constraints.len(),
            input: input.clone(),
            records: records.len(),
        });
    }
    let window: Vec<Record> = records
        .into_iter()
        .zip(constraints)
        .map(|(items, sensitive)| Record { items, sensitive })
        .collect();
    spinner.set_message(format!("anonymizing {} records", window.len()));
    let engine_started = Instant::now();
    let mut anonymized = anonymize(&window, &params, args.seed).map_err(engine_error)?;
    anonymized.report.seconds = engine_started.elapsed().as_secs_f64();
    drop(window);

    spinner.set_message("writing");
    let mut order: Vec<usize> = (0..anonymized.records.len()).collect();
    if !args.keep_order {
        // A separate stream of the seed, so the output order does not replay the engine's choices.
        let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
        rng.set_stream(1);
        order.shuffle(&mut rng);
    }
    write_item_sets(
        &args.output,
        &names,
        order.iter().map(|&i| &anonymized.records[i]),
    )?;
    let report = anonymized.report;
    if let Some(path) = &args.report {
        let batch = BatchReport {
            report: &report,
            total_seconds: started.elapsed().as_secs_f64(),
            input,
            sensitive: args.sensitive.display().to_string(),
        };
        let json = serde_json::to_vec_pretty(&batch).map_err(|e| TransactionsCliError::Io {
            path: path.display().to_string(),
            source: e.into(),
        })?;
        write_atomically(path, &json)?;
    }
    spinner.finish_and_clear();
    eprintln!(
        "{} records: suppressed {} of {} occurrences (util_info {:.4}, util_dist {:.4}, util_mining {:.4}), {} rounds, {:.3} s anonymizing, {:.3} s total",
        report.records,
        report.suppressed,
        report.occurrences,
        report.util_info,
        report.util_dist,
        report.util_mining,
        report.rounds,
        report.seconds,
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TransactionsCliError> {
    crate::atomic_file::write(path, bytes).map_err(io_error(path))
}

fn run_constraints(args: &ConstraintsArgs) -> Result<(), TransactionsCliError> {
    if !(0.0..=1.0).contains(&args.sensitive_share) {
        return Err(TransactionsCliError::Argument {
            field: "sensitive-share",
            rule: format!("{} is outside [0, 1]", args.sensitive_share),
        });
    }
    let spinner = progress("reading records");
    let mut names = ItemNames::default();
    let records = read_item_sets(&args.input, &mut names, false)?;
    let universe: Vec<ItemId> = (0..names.names.len() as ItemId).collect();
    spinner.set_message("drawing constraints");
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let constraints =
        PersonalizedPlus::paper(args.sensitive_share).generate(&universe, records.len(), &mut rng);
    spinner.set_message("writing");
    write_item_sets(&args.output, &names, constraints.iter())?;
    spinner.finish_and_clear();
    let marked: usize = constraints.iter().map(Vec::len).sum();
    eprintln!(
        "{} records over {} items: {:.1} sensitive items per record",
        records.len(),
        universe.len(),
        marked as f64 / records.len().max(1) as f64
    );
    Ok(())
}

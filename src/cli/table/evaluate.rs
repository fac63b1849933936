//! `cloakd table evaluate JOB.toml --release OUT.csv [--sensitive-table OUT.sensitive.csv]
//! [--report EVAL.json] [--input FILE]`: measures a published release (made by `cloakd table
//! anonymize` or any other tool, or the original table itself) against the job's original table:
//! Ploss, Uloss, A_know, A_acc, COUNT query error, discernibility and average class size
//! ([`crate::measures::evaluate`]); with `--workload ATTR [--classifiers j48,rf,nb] [--folds 10]
//! [--seed N]` also Brickell & Shmatikov's learning workload ([`crate::measures::workload`]: U_max,
//! U_base with its sanitization and classifier, U_san and U_san - U_base per classifier) under
//! `workload`. Beside them the release's re-identification risk under `risk`
//! ([`crate::risk::profile`]): without risk options the sample-based models (no SUDA, no k-map);
//! `table risk`'s options ([`super::risk_options::RiskOptionArgs`]: a population, a population
//! table, SUDA with `--suda-max-size`, k-map with `--k-map`, ...) measure more. The report is JSON,
//! on stdout unless `--report` names a file.
use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};

use super::input::load_table;
use super::risk_options::{Defaults, RiskOptionArgs, risk_error};
use crate::jobs::files::{open_input, read_job};
use crate::measures::evaluate::{Baseline, Evaluation, EvaluationOptions, evaluate};
use crate::measures::released::read_release;
use crate::measures::workload::{
    DEFAULT_MAX_MODEL_CELLS, WorkloadEvaluation, WorkloadOptions, measure_workload_unless,
};
use crate::risk::classes::of_release;
use crate::risk::matching::Sample;
use crate::risk::profile;

/// Options of the utility measures, shared by `evaluate` and `frontier`.
#[derive(Debug, Clone, clap::Args)]
pub struct MeasureArgs {
    /// Minimum support of a large population (fraction of the table) for Uloss.
    #[arg(long, default_value_t = 0.05)]
    pub min_support: f64,
    /// Number of random COUNT queries.
    #[arg(long, default_value_t = 1000)]
    pub queries: usize,
    /// QI predicates per COUNT query.
    #[arg(long, default_value_t = 4)]
    pub qd: usize,
    /// Fraction of each attribute's values a query predicate selects.
    #[arg(long, default_value_t = 0.05)]
    pub sel: f64,
    /// Seed of the query workload.
    #[arg(long, default_value_t = 1)]
    pub query_seed: u64,
}

impl MeasureArgs {
    pub fn options(&self) -> EvaluationOptions {
        EvaluationOptions {
            min_support: self.min_support,
            queries: self.queries,
            qd: self.qd,
            sel: self.sel,
            seed: self.query_seed,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    /// The job file (TOML) describing the original table (input, column roles, hierarchies).
    pub job: PathBuf,
    /// The released table (generalized CSV, bucketization's QI CSV, or the original table).
    #[arg(long, value_name = "OUT.csv")]
    pub release: PathBuf,
    /// Bucketization's sensitive table (`group,<sensitive>,count`).
    #[arg(long, value_name = "OUT.sensitive.csv")]
    pub sensitive_table: Option<PathBuf>,
    /// Where to write the JSON report (default: stdout).
    #[arg(long, value_name = "EVAL.json")]
    pub report: Option<PathBuf>,
    /// Original table (plain or gzip CSV), overriding the job's `input`.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub measures: MeasureArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub risk: RiskOptionArgs,
}

/// The learning workload's attribute, classifiers and folds, shared by `table evaluate` and
/// `table frontier` (each names its own seed flag).
#[derive(Debug, Clone, clap::Args)]
pub struct LearningArgs {
    /// Learn this attribute from the other released attributes (Brickell & Shmatikov's workload).
    #[arg(long, value_name = "ATTR")]
    pub workload: Option<String>,
    /// Classifiers to run, comma-separated, among j48, rf, nb.
    #[arg(long, default_value = "j48,rf,nb", requires = "workload")]
    pub classifiers: String,
    /// Folds of the stratified cross-validation (Weka's `-x`).
    #[arg(long, default_value_t = 10, requires = "workload")]
    pub folds: usize,
}

impl LearningArgs {
    /// The workload's options with `seed`, validated; `None` without `--workload`.
    pub fn options(&self, seed: u64) -> anyhow::Result<Option<WorkloadOptions>> {
        let Some(attribute) = &self.workload else {
            return Ok(None);
        };
        Ok(Some(WorkloadOptions::parse(
            attribute,
            Some(self.classifiers.split(',')),
            Some(self.folds),
            Some(seed),
        )?))
    }
}

/// The learning workload's options of `table evaluate`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    #[command(flatten)]
    pub learning: LearningArgs,
    /// Seed of the folds and of the forest (Weka's `-s`).
    #[arg(long, default_value_t = 1, requires = "workload")]
    pub seed: u64,
}

impl WorkloadArgs {
    /// The workload's options, validated; `None` without `--workload`.
    pub fn options(&self) -> anyhow::Result<Option<WorkloadOptions>> {
        self.learning.options(self.seed)
    }
}

/// The JSON report: the evaluation, the release's re-identification risk (under the risk options:
/// without them, no SUDA, k-map or population uniqueness), and the workload when asked for.
#[derive(Debug, serde::Serialize)]
struct Report {
    #[serde(flatten)]
    evaluation: Evaluation,
    risk: crate::risk::RiskProfile,
    #[serde(skip_serializing_if = "Option::is_none")]
    workload: Option<WorkloadEvaluation>,
}

pub fn run(args: EvaluateArgs) -> anyhow::Result<()> {
    let options = args.measures.options();
    options.validate()?;
    let workload_options = args.workload.options()?;
    let job = read_job(&args.job)?;
    let risk_options = args.risk.options(Defaults::Report, &job)?;
    let table = load_table(&job, &args.job, args.input.as_deref())?;
    let release_reader = open_input(&args.release, None)?;
    let mut sensitive_reader: Option<Box<dyn Read>> = match &args.sensitive_table {
        Some(path) => Some(open_input(path, None)?),
        None => None,
    };
    let sensitive_name = args
        .sensitive_table
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let release = read_release(
        &table,
        release_reader,
        &args.release.display().to_string(),
        sensitive_reader
            .as_mut()
            .map(|r| (r.as_mut() as &mut dyn Read, sensitive_name.as_str())),
        job.delimiter,
    )?;
    if matches!(release, crate::relational::release::Release::Generalized(_))
        && args.sensitive_table.is_none()
        && !release_has_sensitive(&release, &table.sensitive.name)
    {
        bail!(
            "the release has no sensitive column: for a bucketized release pass --sensitive-table"
        );
    }
    let baseline = Baseline::new(&table, options)?;
    let evaluation = evaluate(&table, &baseline, &release)?;
    let workload = match workload_options {
        Some(options) => {
            let never = std::sync::atomic::AtomicBool::new(false);
            Some(
                measure_workload_unless(
                    &table,
                    &release,
                    options,
                    DEFAULT_MAX_MODEL_CELLS,
                    &never,
                )?
                .expect("a workload that cannot be cancelled completes"),
            )
        }
        None => None,
    };
    drop(baseline);
    drop(table);
    let population = args.risk.load_population(&job, &args.job)?;
    let columns = of_release(release.quasi_table());
    let (risk_options, population_table) = args.risk.match_population(
        risk_options,
        &columns,
        Sample::Release(release.quasi_table()),
        population,
    )?;
    let risk = profile(&columns, &risk_options, population_table.as_ref()).map_err(risk_error)?;
    let json = serde_json::to_string_pretty(&Report {
        evaluation,
        risk,
        workload,
    })?;
    match &args.report {
        Some(path) => crate::atomic_file::write(path, format!("{json}\n").as_bytes())
            .with_context(|| format!("{}: cannot write the report", path.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}

fn release_has_sensitive(release: &crate::relational::release::Release, name: &str) -> bool {
    match release {
        crate::relational::release::Release::Generalized(t) => {
            t.columns.iter().any(|c| c.name == name)
        }
        crate::relational::release::Release::Bucketized { .. } => true,
    }
}

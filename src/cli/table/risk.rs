//! `cloakd table risk JOB [--release FILE] [--input FILE] [--population N | --sampling-fraction F]
//! [--suda-max-size M] [--no-suda] [--threshold T] [--report FILE]`: the re-identification risk of
//! a job's table, or of a release of it, on the job's quasi-identifiers ([`crate::risk::profile`]):
//! prosecutor, journalist and marketer risk, sample and population uniqueness, SUDA. Prints a
//! readable table on stdout and writes the JSON report (a top-level `risk` object) to `--report`.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::evaluate::read_job;
use super::input::{load_table, open_maybe_gzip};
use crate::measures::released::read_release;
use crate::relational::release::Release;
use crate::risk::classes::{QuasiColumns, of_release, of_table};
use crate::risk::population::Estimate;
use crate::risk::{Measured, Population, RiskOptions, RiskProfile, profile};

#[derive(Debug, clap::Args)]
pub struct RiskArgs {
    /// The job file (TOML): the table, its quasi-identifiers and hierarchies.
    pub job: PathBuf,
    /// Measure this release of the job's table (generalized CSV, or bucketization's QI CSV)
    /// instead of the table itself.
    #[arg(long, value_name = "OUT.csv")]
    pub release: Option<PathBuf>,
    /// Original table (plain or gzip CSV), overriding the job's `input`.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The population's size, for population uniqueness and DIS-SUDA.
    #[arg(long, value_name = "N", conflicts_with = "sampling_fraction")]
    pub population: Option<f64>,
    /// The sample's share of the population, in (0, 1] (population = records / F).
    #[arg(long, value_name = "F")]
    pub sampling_fraction: Option<f64>,
    /// SUDA's largest MSU size (default: all quasi-identifiers).
    #[arg(long, value_name = "M")]
    pub suda_max_size: Option<usize>,
    /// Skip SUDA.
    #[arg(long, conflicts_with = "suda_max_size")]
    pub no_suda: bool,
    /// A record is at risk when its risk is above this.
    #[arg(long, value_name = "T", default_value_t = 0.2)]
    pub threshold: f64,
    /// Where to write the JSON report.
    #[arg(long, value_name = "RISK.json")]
    pub report: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Report<'a> {
    risk: &'a RiskProfile,
}

pub fn run(args: RiskArgs) -> anyhow::Result<()> {
    let options = RiskOptions {
        threshold: args.threshold,
        population: match (args.population, args.sampling_fraction) {
            (Some(n), _) => Some(Population::Size(n)),
            (None, Some(f)) => Some(Population::SamplingFraction(f)),
            (None, None) => None,
        },
        suda_max_size: args.suda_max_size,
        suda: !args.no_suda,
    };
    options.validate()?;
    let job = read_job(&args.job)?;
    let table = load_table(&job, &args.job, args.input.as_deref())?;
    let columns: QuasiColumns = match &args.release {
        None => of_table(&table),
        Some(path) => {
            let reader = open_maybe_gzip(path, None)?;
            let release = read_release(
                &table,
                reader,
                &path.display().to_string(),
                None,
                job.delimiter,
            )?;
            match &release {
                Release::Generalized(t) => of_release(t),
                Release::Bucketized { quasi_table, .. } => of_release(quasi_table),
            }
        }
    };
    drop(table);
    let started = Instant::now();
    let risk = profile(&columns, &options, None)?;
    let seconds = started.elapsed().as_secs_f64();
    print!("{}", render(&risk));
    eprintln!(
        "cloakd: risk of {} records computed in {seconds:.3}s",
        risk.records
    );
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&Report { risk: &risk })?;
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("{}: cannot write the report", path.display()))?;
    }
    Ok(())
}

fn percent(x: f64) -> String {
    format!("{:.4}%", 100.0 * x)
}

/// The readable table of a profile.
pub fn render(risk: &RiskProfile) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<34} {value}\n"));
    line("quasi-identifiers", risk.quasi_identifiers.join(", "));
    line(
        "records / classes / outliers",
        format!("{} / {} / {}", risk.records, risk.classes, risk.outliers),
    );
    line("threshold", risk.threshold.to_string());
    let record = |name: &str, m: &Measured<crate::risk::sample::RecordRisk>| match m {
        Measured::Value(r) => format!(
            "{name}: highest {}, average {}, records at risk {}",
            percent(r.highest),
            percent(r.average),
            percent(r.records_at_risk)
        ),
        Measured::Unavailable { unavailable } => format!("{name}: unavailable ({unavailable})"),
    };
    line("sample risk", record("prosecutor", &risk.prosecutor));
    let journalist = match &risk.journalist {
        Measured::Value(j) => Measured::Value(j.risk.clone()),
        Measured::Unavailable { unavailable } => Measured::Unavailable {
            unavailable: unavailable.clone(),
        },
    };
    line("", record("journalist", &journalist));
    line(
        "",
        match &risk.marketer {
            Measured::Value(m) => format!("marketer: average {}", percent(m.average)),
            Measured::Unavailable { unavailable } => {
                format!("marketer: unavailable ({unavailable})")
            }
        },
    );
    line(
        "sample uniqueness",
        match &risk.sample_uniqueness {
            Measured::Value(u) => format!("{} records ({})", u.unique_records, percent(u.share)),
            Measured::Unavailable { unavailable } => format!("unavailable ({unavailable})"),
        },
    );
    match &risk.population_uniqueness {
        Measured::Value(p) => {
            line(
                "population",
                format!(
                    "{} (sampling fraction {:.6})",
                    p.population_size, p.sampling_fraction
                ),
            );
            let estimate = |e: &Estimate| match e {
                Estimate::Estimated { uniques, share } => {
                    format!("{uniques:.1} uniques ({})", percent(*share))
                }
                Estimate::Unavailable { unavailable } => format!("unavailable ({unavailable})"),
            };
            line("population uniqueness: pitman", estimate(&p.pitman));
            line("                       zayatz", estimate(&p.zayatz));
            line("                       snb", estimate(&p.snb));
            line(
                "                       dankar",
                format!("{} [{}]", estimate(&p.dankar.estimate), p.dankar.model),
            );
        }
        Measured::Unavailable { unavailable } => line(
            "population uniqueness",
            format!("unavailable ({unavailable})"),
        ),
    }
    match &risk.suda {
        Measured::Value(s) => {
            line(
                "SUDA: MSUs by size",
                format!("{:?} (max size {})", s.msus_by_size, s.max_size),
            );
            line("      records with an MSU", s.records_with_msu.to_string());
            line(
                "      score highest / average",
                format!("{:.1} / {:.3}", s.highest_score, s.average_score),
            );
            line(
                "      DIS-SUDA highest / average",
                format!("{:.6} / {:.6}", s.highest_dis_score, s.average_dis_score),
            );
            let contributions: Vec<String> = s
                .attribute_contributions
                .iter()
                .map(|c| format!("{} {}", c.attribute, percent(c.contribution)))
                .collect();
            line("      attribute contributions", contributions.join(", "));
        }
        Measured::Unavailable { unavailable } => {
            line("SUDA", format!("unavailable ({unavailable})"))
        }
    }
    out
}

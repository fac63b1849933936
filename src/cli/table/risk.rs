//! `cloakd table risk JOB [--release FILE] [--input FILE] [--population N | --sampling-fraction F]
//! [--population-table CSV] [--suda-max-size M] [--no-suda] [--threshold T] [--k-map K]
//! [--k-map-significance A] [--delta-min D] [--delta-max D] [--qi-discovery M] [--report FILE]`:
//! the re-identification risk of a job's table, or of a release of it, on the job's
//! quasi-identifiers ([`crate::risk::profile`]): prosecutor, journalist and marketer risk, sample
//! and population uniqueness, SUDA, k-map, δ-presence against a population table, QI discovery.
//! Prints a readable table on stdout and writes the JSON report (a top-level `risk` object) to
//! `--report`. The population table is read like the table (the job's schema, delimiter and
//! hierarchies, plain or gzip) and matched by [`crate::risk::matching`]. The risk options are
//! [`super::risk_options::RiskOptionArgs`], shared with `table evaluate` and `table anonymize`.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::input::load_table;
use super::risk_options::{Defaults, RiskOptionArgs, risk_error};
use crate::jobs::files::{open_input, read_job};
use crate::measures::released::read_release;
use crate::relational::release::Release;
use crate::risk::classes::{QuasiColumns, of_release, of_table};
use crate::risk::matching::Sample;
use crate::risk::population::Estimate;
use crate::risk::{Measured, RiskProfile, profile};

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
    #[command(flatten)]
    pub risk: RiskOptionArgs,
    /// Where to write the JSON report.
    #[arg(long, value_name = "RISK.json")]
    pub report: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Report<'a> {
    risk: &'a RiskProfile,
}

pub fn run(args: RiskArgs) -> anyhow::Result<()> {
    let job = read_job(&args.job)?;
    let options = args.risk.options(Defaults::Profile, &job)?;
    let table = load_table(&job, &args.job, args.input.as_deref())?;
    let population = args.risk.load_population(&job, &args.job)?;
    let release = match &args.release {
        None => None,
        Some(path) => {
            let reader = open_input(path, None)?;
            Some(read_release(
                &table,
                reader,
                &path.display().to_string(),
                None,
                job.delimiter,
            )?)
        }
    };
    let released = release.as_ref().map(Release::quasi_table);
    let columns: QuasiColumns = match released {
        None => of_table(&table),
        Some(t) => of_release(t),
    };
    let started = Instant::now();
    let sample = match released {
        None => Sample::Table(&table),
        Some(t) => Sample::Release(t),
    };
    let (options, population_table) = args
        .risk
        .match_population(options, &columns, sample, population)?;
    drop(table);
    let risk = profile(&columns, &options, population_table.as_ref()).map_err(risk_error)?;
    let seconds = started.elapsed().as_secs_f64();
    print!("{}", render(&risk));
    eprintln!(
        "cloakd: risk of {} records computed in {seconds:.3}s",
        risk.records
    );
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&Report { risk: &risk })?;
        crate::atomic_file::write(path, format!("{json}\n").as_bytes())
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
    if risk.prosecutor_wildcard != risk.prosecutor {
        // Only partly suppressed records make the two differ.
        line(
            "",
            record("prosecutor, * any value", &risk.prosecutor_wildcard),
        );
    }
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
    if let Some(k) = &risk.k_map {
        line(
            "k-map",
            format!("k = {}, significance {}", k.k, k.significance),
        );
        line(
            "      against the population table",
            match &k.population_table {
                Measured::Value(e) => format!(
                    "{} (smallest population class {}, {} classes and {} of records below k)",
                    if e.satisfied { "satisfied" } else { "violated" },
                    e.smallest_population_class,
                    e.classes_violating,
                    percent(e.records_violating)
                ),
                Measured::Unavailable { unavailable } => format!("unavailable ({unavailable})"),
            },
        );
        for (name, m) in [
            ("      D3 (Poisson)", &k.d3),
            ("      D4 (zero-truncated)", &k.d4),
        ] {
            line(
                name,
                match m {
                    Measured::Value(e) => format!(
                        "{} (k' = {}, {} classes and {} of records below k', smallest class ≈ {:.1} in the population)",
                        if e.satisfied { "satisfied" } else { "violated" },
                        e.derived_k,
                        e.classes_violating,
                        percent(e.records_violating),
                        e.smallest_estimated_population_class
                    ),
                    Measured::Unavailable { unavailable } => {
                        format!("unavailable ({unavailable})")
                    }
                },
            );
        }
    }
    match &risk.delta_presence {
        Some(Measured::Value(d)) => {
            let bounds = match d.within_bounds {
                Some(true) => ", within the bounds".to_string(),
                Some(false) => format!(
                    ", {} classes outside the bounds",
                    d.classes_outside.unwrap_or(0)
                ),
                None => String::new(),
            };
            line(
                "delta-presence",
                format!(
                    "min {:.6}, max {:.6}, average {:.6}{bounds}; {} population records match no class",
                    d.delta_min, d.delta_max, d.delta_average, d.population_unmatched
                ),
            );
        }
        Some(Measured::Unavailable { unavailable }) => {
            line("delta-presence", format!("unavailable ({unavailable})"))
        }
        None => {}
    }
    match &risk.qi_discovery {
        Some(Measured::Value(d)) => {
            line(
                "QI discovery (top 10 of all)",
                format!(
                    "{} combinations of at most {}",
                    d.combinations.len(),
                    d.max_size
                ),
            );
            for c in d.combinations.iter().take(10) {
                line(
                    "",
                    format!(
                        "separation {:.6}, distinction {:.6}: {}",
                        c.separation,
                        c.distinction,
                        c.attributes.join(", ")
                    ),
                );
            }
        }
        Some(Measured::Unavailable { unavailable }) => {
            line("QI discovery", format!("unavailable ({unavailable})"))
        }
        None => {}
    }
    out
}

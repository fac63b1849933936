//! `cloakd table anonymize`: the batch relational anonymizer on files. Reads the job (TOML), its
//! hierarchies and the input CSV (gzip detected by content), applies the command line overrides, runs
//! [`crate::relational::anonymize`] and writes the release and the report (with the release's
//! re-identification risk under `table risk`'s options, [`super::risk_options::RiskOptionArgs`]). Output files are written
//! to a temporary file beside the target and renamed into place, so an error never leaves a partial
//! output behind. A progress bar on stderr shows the reading of the input (hidden when stderr is not a
//! terminal).
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, anyhow, bail};

use super::input::load_table;
use super::risk_options::{Defaults, RiskOptionArgs, risk_error};
use crate::atomic_file::AtomicFile;
use crate::relational::job::{AlgorithmField, AlgorithmOverrides, JobSpec};
use crate::relational::models::{LDiversity, TCloseness};
use crate::relational::release::{self, Release, ReleaseMethod};
use crate::risk::classes::of_release;
use crate::risk::matching::Sample;
use crate::risk::profile;

#[derive(Debug, clap::Args)]
pub struct AnonymizeArgs {
    /// The job file (TOML): input, column roles, privacy models, release.
    pub job: PathBuf,
    /// Where to write the released table (bucketization also writes OUT.sensitive.csv).
    #[arg(long, value_name = "OUT.csv")]
    pub output: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, value_name = "REPORT.json")]
    pub report: Option<PathBuf>,
    /// Input CSV (plain or gzip), overriding the job's `input`.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// k-anonymity, k >= 1.
    #[arg(long)]
    pub k: Option<i64>,
    /// l-diversity: distinct:L, entropy:L, probabilistic:L or recursive:L:c=C.
    #[arg(long, value_name = "KIND:L")]
    pub l: Option<String>,
    /// t-closeness: emd:T or js:T, T in [0, 1].
    #[arg(long, value_name = "DISTANCE:T")]
    pub t: Option<String>,
    /// delta-disclosure, delta > 0.
    #[arg(long, allow_hyphen_values = true)]
    pub delta: Option<f64>,
    /// Highest prosecutor risk allowed (1 / the smallest released class), in (0, 1].
    #[arg(long, value_name = "RISK", allow_hyphen_values = true)]
    pub max_risk_highest: Option<f64>,
    /// Average prosecutor risk allowed (released classes / released records), in (0, 1].
    #[arg(long, value_name = "RISK", allow_hyphen_values = true)]
    pub max_risk_average: Option<f64>,
    /// Release method: generalization, bucketization or trivial.
    #[arg(long)]
    pub release: Option<String>,
    /// Seed of the release's random row order.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Algorithm: mondrian (default), kaca (local recoding by clustering in the hierarchies) or ola
    /// (optimal full-domain generalization).
    #[arg(long)]
    pub algorithm: Option<String>,
    /// OLA's information-loss metric: dm, prec or entropy.
    #[arg(long)]
    pub metric: Option<String>,
    /// OLA: the share of rows that may be suppressed, in [0, 1].
    #[arg(long, value_name = "SHARE")]
    pub max_suppression: Option<f64>,
    /// Formula-like CSV cells (starting with =, +, -, @, tab or CR, not a number): neutralize
    /// (the default: written as '<cell>, quoted) or keep (raw values); overrides the job's
    /// `[release] formulas`.
    #[arg(long, value_name = "neutralize|keep")]
    pub formulas: Option<String>,
    /// The risk options of the report's `risk` object (with --report).
    #[command(flatten)]
    pub risk: RiskOptionArgs,
}

/// Reads a job file and applies the command line overrides; errors name the file or the flag.
pub fn load_job(args: &AnonymizeArgs) -> anyhow::Result<JobSpec> {
    let text = crate::data_files::read_text_file(&args.job)
        .with_context(|| format!("{}: cannot read the job file", args.job.display()))?;
    let mut job = JobSpec::parse(&args.job.display().to_string(), &text)?;
    if let Some(k) = args.k {
        if k < 1 {
            bail!("--k {k}: k must be at least 1");
        }
        job.privacy.k = Some(k as u64);
    }
    if let Some(l) = &args.l {
        job.privacy.l = Some(l.parse::<LDiversity>().map_err(|e| anyhow!("--l {e}"))?);
    }
    if let Some(t) = &args.t {
        job.privacy.t = Some(t.parse::<TCloseness>().map_err(|e| anyhow!("--t {e}"))?);
    }
    if let Some(delta) = args.delta {
        if !(delta.is_finite() && delta > 0.0) {
            bail!("--delta {delta}: delta must be a finite number > 0");
        }
        job.privacy.delta = Some(delta);
    }
    for (flag, value, slot) in [
        (
            "--max-risk-highest",
            args.max_risk_highest,
            &mut job.privacy.risk.highest,
        ),
        (
            "--max-risk-average",
            args.max_risk_average,
            &mut job.privacy.risk.average,
        ),
    ] {
        if let Some(r) = value {
            if !(r > 0.0 && r <= 1.0) {
                bail!("{flag} {r}: the risk bound must lie in (0, 1]");
            }
            *slot = Some(r);
        }
    }
    if let Some(method) = &args.release {
        job.release = method
            .parse::<ReleaseMethod>()
            .map_err(|e| anyhow!("--release: {e}"))?;
    }
    job.override_algorithm(AlgorithmOverrides {
        algorithm: args.algorithm.as_deref(),
        metric: args.metric.as_deref(),
        max_suppression: args.max_suppression,
    })
    .map_err(|e| {
        let flag = match e.field {
            AlgorithmField::Algorithm => "--algorithm",
            AlgorithmField::Metric => "--metric",
            AlgorithmField::MaxSuppression => "--max-suppression",
        };
        anyhow!("{flag}: {}", e.rule)
    })?;
    if let Some(seed) = args.seed {
        job.seed = seed;
    }
    if let Some(formulas) = &args.formulas {
        job.formulas = formulas.parse().map_err(|e| anyhow!("--formulas: {e}"))?;
    }
    Ok(job)
}

/// One output written beside its target ([`AtomicFile`]), put in place on [`Staged::commit`] once
/// every output is written; dropped uncommitted, it is removed.
pub(super) struct Staged {
    file: AtomicFile,
    target: PathBuf,
}

impl Staged {
    pub(super) fn new(target: &Path) -> anyhow::Result<Staged> {
        let file = AtomicFile::create(target)
            .with_context(|| format!("{}: cannot create", target.display()))?;
        Ok(Staged {
            file,
            target: target.to_path_buf(),
        })
    }

    pub(super) fn write(
        &mut self,
        body: impl FnOnce(&mut BufWriter<&mut File>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut writer = BufWriter::with_capacity(1 << 20, self.file.file());
        body(&mut writer).with_context(|| format!("{}: cannot write", self.target.display()))?;
        writer
            .flush()
            .with_context(|| format!("{}: cannot write", self.target.display()))
    }

    pub(super) fn commit(self) -> anyhow::Result<()> {
        self.file
            .commit()
            .with_context(|| format!("{}: cannot move into place", self.target.display()))
    }
}

/// `OUT.csv` → `OUT.sensitive.csv`.
pub fn sensitive_path(output: &Path) -> PathBuf {
    let stem = output.file_stem().unwrap_or_default().to_string_lossy();
    let ext = output
        .extension()
        .map(|e| e.to_string_lossy().to_string())
        .unwrap_or_else(|| "csv".to_string());
    output.with_file_name(format!("{stem}.sensitive.{ext}"))
}

pub(super) fn anonymize(args: AnonymizeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let job = load_job(&args)?;
    if args.report.is_none()
        && let Some(flag) = args.risk.given().first()
    {
        bail!("{flag}: a risk option of the report (rule: give --report with it)");
    }
    let risk_options = args.risk.options(Defaults::Report, &job)?;
    let table = load_table(&job, &args.job, args.input.as_deref())?;
    let read_seconds = started.elapsed().as_secs_f64();
    let (released, report) =
        crate::jobs::anonymize_job(&table, &job, &std::sync::atomic::AtomicBool::new(false))?;
    drop(table);
    let population = args.risk.load_population(&job, &args.job)?;
    let columns = of_release(released.quasi_table());
    let (risk_options, population_table) = args.risk.match_population(
        risk_options,
        &columns,
        Sample::Release(released.quasi_table()),
        population,
    )?;
    let risk = profile(&columns, &risk_options, population_table.as_ref()).map_err(risk_error)?;
    drop(columns);
    let write_started = Instant::now();
    write_release(
        &released,
        job.formulas,
        &args.output,
        args.report.as_deref(),
        &crate::jobs::release_report::AnonymizeReport {
            report: &report,
            risk: &risk,
        },
    )?;
    eprintln!(
        "cloakd: {} rows, {} classes, k={}, l_distinct={}, t_emd={:.4}, t_js={:.4}, delta={}; homogeneous classes {} ({:.2}% of rows), background posterior {:.4}; read {:.3}s, anonymize {:.3}s, write {:.3}s",
        report.rows,
        report.classes,
        report.k,
        report.l_distinct,
        report.t_emd,
        report.t_js,
        report
            .delta
            .map_or("unbounded".to_string(), |d| format!("{d:.4}")),
        report.attacks.homogeneity.classes,
        100.0 * report.attacks.homogeneity.share_of_records,
        report.attacks.background_knowledge.posterior,
        read_seconds,
        report.seconds,
        write_started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes the release (and report) through staged files: all or nothing.
pub fn write_release(
    released: &Release,
    formulas: release::Formulas,
    output: &Path,
    report_path: Option<&Path>,
    report: &impl serde::Serialize,
) -> anyhow::Result<()> {
    let mut staged = Vec::new();
    match released {
        Release::Generalized(table) => {
            let mut out = Staged::new(output)?;
            out.write(|w| Ok(release::write_csv(table, formulas, w)?))?;
            staged.push(out);
        }
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => {
            let mut out = Staged::new(output)?;
            out.write(|w| Ok(release::write_csv(quasi_table, formulas, w)?))?;
            staged.push(out);
            let mut sens = Staged::new(&sensitive_path(output))?;
            sens.write(|w| Ok(release::write_sensitive_csv(sensitive_table, formulas, w)?))?;
            staged.push(sens);
        }
    }
    if let Some(path) = report_path {
        let mut rep = Staged::new(path)?;
        rep.write(|w| {
            serde_json::to_writer_pretty(&mut *w, report)?;
            w.write_all(b"\n")?;
            Ok(())
        })?;
        staged.push(rep);
    }
    for s in staged {
        s.commit()?;
    }
    Ok(())
}

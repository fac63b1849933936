//! `cloakd table frontier JOB.toml --out DIR [--input FILE]`: anonymizes the job's table under a sweep
//! of privacy models and parameters (Li & Li's sets by default; `--k`, `--l`, `--t`, `--delta` take
//! comma-separated lists, an empty list drops the model) with each release method and each algorithm
//! (`--algorithms mondrian,ola`: one series per algorithm on the same axes; KACA and OLA generalize
//! only, so their bucketization pairs are left out), measures every release ([`crate::measures::evaluate`]) and writes `DIR/frontier.csv` and the plots of
//! [`crate::measures::frontier::charts`] drawn by [`crate::plots`] (`--format svg,png`, default svg). Releases run on all cores (`--threads`, default the
//! machine's parallelism), one release per thread at a time, sharing the table and the measurement
//! baseline read-only; a progress bar on stderr counts finished releases. A model a parameter makes
//! unsatisfiable is reported and left out.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Deserialize;

use super::evaluate::{LearningArgs, MeasureArgs};
use super::input::load_table;
use crate::budget::MemoryBudget;
use crate::jobs::files::read_job;
use crate::jobs::sweep::{SweepLimits, SweepOptions, SweepPlan, default_threads, run_sweep};
use crate::measures::evaluate::Baseline;
use crate::measures::frontier::{charts, mark_efficient, write_csv};
use crate::measures::workload::{DEFAULT_MAX_MODEL_CELLS, WorkloadBaseline};
use crate::plots::Format;
use crate::relational::job::JobSpec;

#[derive(Debug, clap::Args)]
pub struct FrontierArgs {
    /// The job file (TOML): input and column roles (its [privacy] is ignored); its optional
    /// [sweep] section gives the settings of every flag below that is not given.
    pub job: PathBuf,
    /// Directory for frontier.csv and the plots (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Original table (plain or gzip CSV), overriding the job's `input`.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// k values (k-anonymity).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub k: Option<Vec<f64>>,
    /// l values (probabilistic l-diversity).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub l: Option<Vec<f64>>,
    /// t values (t-closeness, with the distance of --t-distance).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub t: Option<Vec<f64>>,
    /// The distance of t-closeness: js (Li & Li's) or emd [default: js].
    #[arg(long)]
    pub t_distance: Option<String>,
    /// delta values (delta-disclosure).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub delta: Option<Vec<f64>>,
    /// Release methods [default: generalization,bucketization].
    #[arg(long, value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Algorithms (mondrian, kaca, ola): one series per algorithm in frontier.csv and the plots
    /// [default: mondrian].
    #[arg(long, value_delimiter = ',')]
    pub algorithms: Option<Vec<String>>,
    /// OLA's information-loss metric: dm, prec or entropy [default: dm].
    #[arg(long)]
    pub metric: Option<String>,
    /// OLA: the share of rows that may be suppressed, in [0, 1] [default: 0].
    #[arg(long, value_name = "SHARE")]
    pub max_suppression: Option<f64>,
    /// Worker threads (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Plot formats, comma-separated: svg, png (each plot written once per format).
    #[arg(long, value_delimiter = ',', default_value = "svg")]
    pub format: Vec<String>,
    /// Seed of each release's row order and group ids [default: 7].
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub measures: MeasureArgs,
    /// The learning workload: U_base and U_san − U_base per classifier in frontier.csv, and the
    /// workload chart.
    #[command(flatten)]
    pub learning: LearningArgs,
    /// Seed of the workload's folds and forests (and of a bucketized release's association)
    /// [default: 1].
    #[arg(long)]
    pub learning_seed: Option<u64>,
}

/// A job's `[sweep]` section: the settings of the flags of the same names (the workbench writes it
/// when it saves a project). Every key is optional; a flag given on the command line wins.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepSection {
    k: Option<Vec<f64>>,
    l: Option<Vec<f64>>,
    t: Option<Vec<f64>>,
    delta: Option<Vec<f64>>,
    t_distance: Option<String>,
    methods: Option<Vec<String>>,
    algorithms: Option<Vec<String>>,
    metric: Option<String>,
    max_suppression: Option<f64>,
    seed: Option<u64>,
    workload: Option<WorkloadSection>,
}

/// `[sweep.workload]`: the learning workload (`--workload`, `--classifiers`, `--folds`,
/// `--learning-seed`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadSection {
    attribute: String,
    classifiers: Option<Vec<String>>,
    folds: Option<usize>,
    seed: Option<u64>,
}

/// The job's `[sweep]`, or an empty one; an error names the job, the line and the key.
fn sweep_section(job: &JobSpec) -> anyhow::Result<SweepSection> {
    let Some((table, span)) = &job.sweep else {
        return Ok(SweepSection::default());
    };
    SweepSection::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        anyhow::anyhow!(
            "{}: [sweep] (at byte {}): {}",
            job.source_name,
            span.start,
            e.message().trim()
        )
    })
}

/// The sweep the flags ask for, over the job's `[sweep]` ([`SweepOptions`], the same names and
/// defaults as the workbench's).
fn sweep_options(args: &FrontierArgs, section: &SweepSection) -> SweepOptions {
    let or = |flag: &Option<Vec<f64>>, key: &Option<Vec<f64>>| flag.clone().or_else(|| key.clone());
    SweepOptions {
        k: or(&args.k, &section.k),
        l: or(&args.l, &section.l),
        t: or(&args.t, &section.t),
        delta: or(&args.delta, &section.delta),
        t_distance: args
            .t_distance
            .clone()
            .or_else(|| section.t_distance.clone())
            .unwrap_or_else(|| "js".into()),
        methods: args
            .methods
            .clone()
            .or_else(|| section.methods.clone())
            .unwrap_or_else(|| vec!["generalization".into(), "bucketization".into()]),
        algorithms: args
            .algorithms
            .clone()
            .or_else(|| section.algorithms.clone())
            .unwrap_or_else(|| vec!["mondrian".into()]),
        metric: args
            .metric
            .clone()
            .or_else(|| section.metric.clone())
            .unwrap_or_else(|| "dm".into()),
        max_suppression: args
            .max_suppression
            .or(section.max_suppression)
            .unwrap_or(0.0),
        seed: args.seed.or(section.seed).unwrap_or(7),
    }
}

/// The learning workload: the flags when `--workload` is given, else the job's `[sweep.workload]`.
fn workload_options(
    args: &FrontierArgs,
    section: &SweepSection,
) -> anyhow::Result<Option<crate::measures::workload::WorkloadOptions>> {
    if args.learning.workload.is_some() {
        return args.learning.options(args.learning_seed.unwrap_or(1));
    }
    let Some(w) = &section.workload else {
        return Ok(None);
    };
    Ok(Some(crate::measures::workload::WorkloadOptions::parse(
        &w.attribute,
        w.classifiers.as_ref().map(|c| c.iter().map(String::as_str)),
        w.folds,
        Some(args.learning_seed.or(w.seed).unwrap_or(1)),
    )?))
}

pub fn run(args: FrontierArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let options = args.measures.options();
    options.validate()?;
    let job = read_job(&args.job)?;
    let section = sweep_section(&job)?;
    let workload_options = workload_options(&args, &section)?;
    let formats = formats(&args.format)?;
    // The embedded defaults' tables.max_sweep_values and tables.max_sweep_points, as the daemon's.
    let limits = SweepLimits::of(&crate::config::Config::embedded_defaults().tables);
    let plan = SweepPlan::new(&sweep_options(&args, &section), limits).map_err(|e| {
        let value = e.value.map(|v| format!(" {v}")).unwrap_or_default();
        anyhow::anyhow!("--{}{value}: {}", e.field.replace('_', "-"), e.rule)
    })?;
    for (method, algorithm) in &plan.left_out {
        eprintln!("cloakd: {algorithm} does not release by {method}: left out");
    }
    let items = &plan.items;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot create the output directory", args.out.display()))?;
    let table = load_table(&job, &args.job, args.input.as_deref())?;
    let baseline_started = Instant::now();
    let baseline = Baseline::new(&table, options)?;
    eprintln!(
        "cloakd: {} rows; {} large populations (minSup {}), {} COUNT queries (qd {}, sel {}) in {:.2}s; {} releases",
        table.rows(),
        baseline.populations.len(),
        options.min_support,
        baseline.workload.queries.len(),
        baseline.workload.qd,
        baseline.workload.sel,
        baseline_started.elapsed().as_secs_f64(),
        items.len()
    );
    let never = AtomicBool::new(false);
    let learning = match workload_options {
        Some(options) => {
            let learning_started = Instant::now();
            let attribute = options.attribute.clone();
            let learning =
                WorkloadBaseline::new_unless(&table, options, DEFAULT_MAX_MODEL_CELLS, &never)
                    .context("--workload")?
                    .expect("a workload that cannot be cancelled completes");
            eprintln!(
                "cloakd: workload {}: U_base {:.4} ({}, {}) in {:.2}s",
                crate::text::quote(&attribute),
                learning.u_base,
                learning.u_base_classifier.name(),
                learning.u_base_sanitization.name(),
                learning_started.elapsed().as_secs_f64()
            );
            Some(learning)
        }
        None => None,
    };
    let threads = args
        .threads
        .unwrap_or_else(default_threads)
        .clamp(1, items.len());
    // The releases run one per thread; each one's cross-validations then run on that thread
    // alone, so the threads started are the whole budget.
    let learning = learning.map(|mut learning| {
        if threads > 1 {
            learning.options.threads = 1;
        }
        learning
    });
    let progress =
        ProgressBar::with_draw_target(Some(items.len() as u64), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} releases  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let results = run_sweep(
        &table,
        &baseline,
        learning.as_ref(),
        &plan,
        threads,
        &MemoryBudget::unlimited(),
        &never,
        &|i, _| {
            let item = &items[i];
            progress.set_message(format!(
                "{} {} {} {}",
                item.model.name(),
                item.parameter,
                item.method,
                item.algorithm
            ));
            progress.inc(1);
        },
    );
    progress.finish_and_clear();
    let results = results?;
    let mut points = Vec::new();
    for (item, outcome) in items.iter().zip(results) {
        match outcome {
            Some(Ok(point)) => points.push(point),
            Some(Err(reason)) => eprintln!(
                "cloakd: {} {} {} {}: left out: {reason}",
                item.model.name(),
                item.parameter,
                item.method,
                item.algorithm
            ),
            None => eprintln!(
                "cloakd: {} {} {} {}: not measured",
                item.model.name(),
                item.parameter,
                item.method,
                item.algorithm
            ),
        }
    }
    mark_efficient(&mut points);
    let csv_path = args.out.join("frontier.csv");
    let file = std::fs::File::create(&csv_path)
        .with_context(|| format!("{}: cannot create", csv_path.display()))?;
    write_csv(&points, std::io::BufWriter::new(file))
        .with_context(|| format!("{}: cannot write", csv_path.display()))?;
    let charts = charts(&points);
    for chart in &charts {
        write_plot(&args.out, chart.stem, chart, &formats)?;
    }
    println!(
        "{:<17} {:>9} {:<15} {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}  efficient",
        "model",
        "parameter",
        "method",
        "algorithm",
        "ploss",
        "uloss",
        "a_know",
        "a_acc",
        "q_error",
        "gain",
        "seconds"
    );
    for p in &points {
        let e = &p.evaluation;
        println!(
            "{:<17} {:>9} {:<15} {:<9} {:>8.4} {:>8} {:>8.4} {:>8.4} {:>8.4} {:>8} {:>7.2}  {}",
            p.item.model.name(),
            p.item.parameter,
            p.item.method.to_string(),
            p.item.algorithm.to_string(),
            e.ploss,
            e.uloss
                .map_or_else(|| "-".to_string(), |u| format!("{u:.4}")),
            e.a_know,
            e.a_acc,
            e.query_error,
            p.workload_gain()
                .map_or_else(|| "-".to_string(), |g| format!("{g:+.4}")),
            p.seconds,
            if p.efficient { "*" } else { "" }
        );
    }
    eprintln!(
        "cloakd: {} releases measured on {threads} threads in {:.2}s; wrote {} and {} plots",
        points.len(),
        started.elapsed().as_secs_f64(),
        csv_path.display(),
        charts.len() * formats.len()
    );
    Ok(())
}

/// The formats of `--format`, each once, in the order given; at least one.
pub fn formats(given: &[String]) -> anyhow::Result<Vec<Format>> {
    let mut formats = Vec::new();
    for name in given {
        let format: Format = name
            .parse()
            .map_err(anyhow::Error::msg)
            .context("--format")?;
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    if formats.is_empty() {
        bail!("--format: at least one of svg, png");
    }
    Ok(formats)
}

/// Draws a chart in each format and writes `DIR/STEM.EXT` atomically ([`crate::atomic_file`]).
pub fn write_plot(
    dir: &std::path::Path,
    stem: &str,
    chart: &impl crate::plots::Draw,
    formats: &[Format],
) -> anyhow::Result<()> {
    for &format in formats {
        let bytes = crate::plots::render(chart, format)?;
        let path = dir.join(format!("{stem}.{}", format.extension()));
        crate::atomic_file::write(&path, &bytes)
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    Ok(())
}

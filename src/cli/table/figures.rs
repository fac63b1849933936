//! `cloakd table figures --marital JOB --occupation JOB --out DIR`: Brickell & Shmatikov's Figures
//! 1-4 (KDD'08) on cloakd's own sanitizations. Each dataset's job gives its table and column roles
//! (`docs/jobs/bs-marital.toml`, `docs/jobs/bs-occupation.toml`; checked against the paper's
//! quasi-identifier and sensitive attribute); the table is anonymized (generalization, the job's
//! algorithm and seed) under each of the paper's sanitizations alone (`--k`, `--l` for recursive
//! (3, l)-diversity, `--t` for EMD t-closeness, `--delta`; an empty list drops the model), each
//! release is measured ([`crate::measures::figures`]) and the figures are drawn ([`crate::plots`])
//! as `DIR/figN-<dataset>-<workload>.svg|png`, with `DIR/figures.csv` and a table on stdout. A
//! sanitization the table cannot satisfy is reported on stderr and left out.
//!
//! The researcher's bars (U_san − U_base per classifier of the figure) are the learning workload
//! ([`crate::measures::workload`]: stratified `--folds`-fold cross-validation seeded with
//! `--learning-seed`), U_base computed once per figure and U_san on every release, the releases
//! spread over `--threads` threads; `--no-learning` draws the adversary's bars alone ("researcher
//! not measured"), in seconds.
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Context, bail};

use super::frontier::{formats, write_plot};
use super::input::load_table;
use crate::jobs::files::read_job;
use crate::measures::figures::{
    Dataset, Figure, FigureSpec, Measured, PAPER_DELTA, PAPER_K, PAPER_L, PAPER_T, Researcher,
    figure, measure, sanitizations,
};
use crate::measures::workload::{
    Classifier, DEFAULT_MAX_MODEL_CELLS, WorkloadBaseline, WorkloadOptions,
};
use crate::plots::Bars;
use crate::relational::table::Table;

#[derive(Debug, clap::Args)]
pub struct FiguresArgs {
    /// Job of the "Marital" dataset (Figures 1 and 3), e.g. docs/jobs/bs-marital.toml.
    #[arg(long, value_name = "JOB.toml")]
    pub marital: Option<PathBuf>,
    /// Job of the "Occupation" dataset (Figures 2 and 4), e.g. docs/jobs/bs-occupation.toml.
    #[arg(long, value_name = "JOB.toml")]
    pub occupation: Option<PathBuf>,
    /// Directory for figures.csv and the figures (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Original table (plain or gzip CSV) of both datasets, overriding the jobs' `input`.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Figures to draw, comma-separated (default: every figure whose dataset's job is given).
    #[arg(long, value_delimiter = ',')]
    pub figures: Option<Vec<u8>>,
    /// k values (k-anonymity).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub k: Option<Vec<u64>>,
    /// l values of recursive (3, l)-diversity.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub l: Option<Vec<usize>>,
    /// t values (t-closeness, EMD).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub t: Option<Vec<f64>>,
    /// delta values (delta-disclosure).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub delta: Option<Vec<f64>>,
    /// The attribute the researcher learns in Figure 3 ("Marital" dataset).
    #[arg(long, default_value = "income")]
    pub marital_workload: String,
    /// The attribute the researcher learns in Figure 4 ("Occupation" dataset).
    #[arg(long, default_value = "marital-status")]
    pub occupation_workload: String,
    /// Plot formats, comma-separated: svg, png.
    #[arg(long, value_delimiter = ',', default_value = "svg")]
    pub format: Vec<String>,
    /// Folds of the researcher's stratified cross-validation (2 to 100).
    #[arg(long, default_value_t = 10)]
    pub folds: usize,
    /// Seed of the researcher's folds and forests (and of a bucketized release's association).
    #[arg(long, default_value_t = 1)]
    pub learning_seed: u64,
    /// Leave the researcher's side out: the adversary's bars alone.
    #[arg(long)]
    pub no_learning: bool,
    /// Worker threads of the researcher's side (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The researcher's side of one figure: U_base once, then U_san of every release, the releases
/// spread over `threads` threads.
fn researcher(
    table: &Table,
    spec: &FigureSpec,
    measured: &[Measured],
    args: &FiguresArgs,
) -> anyhow::Result<Researcher> {
    let classifiers = spec
        .classifiers
        .iter()
        .map(|c| c.parse::<Classifier>())
        .collect::<Result<Vec<_>, _>>()?;
    let options = WorkloadOptions {
        attribute: spec.workload.clone(),
        classifiers,
        folds: args.folds,
        seed: args.learning_seed,
        threads: 0,
    };
    let never = AtomicBool::new(false);
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    // U_base's cross-validations run one after the other, each on the whole thread budget.
    let mut baseline = WorkloadBaseline::new_unless(
        table,
        WorkloadOptions { threads, ..options },
        DEFAULT_MAX_MODEL_CELLS,
        &never,
    )
    .with_context(|| format!("Figure {}: U_base", spec.number))?
    .expect("a workload that cannot be cancelled completes");
    // The releases run at once, one per thread, each cross-validation on its thread alone: the
    // budget is not multiplied by the folds' threads.
    let threads = threads.min(measured.len().max(1));
    if threads > 1 {
        baseline.options.threads = 1;
    }
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![None; measured.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(m) = measured.get(i) else { break };
                    let outcome = baseline
                        .measure_unless(table, &m.release, DEFAULT_MAX_MODEL_CELLS, &never)
                        .map(|e| {
                            e.expect("a workload that cannot be cancelled completes")
                                .classifiers
                                .iter()
                                .map(|c| c.u_san)
                                .collect::<Vec<f64>>()
                        });
                    results.lock().expect("no worker panics holding it")[i] = Some(outcome);
                }
            });
        }
    });
    let mut u_san = Vec::with_capacity(measured.len());
    for (m, outcome) in measured
        .iter()
        .zip(results.into_inner().expect("no worker panicked"))
    {
        let row = outcome
            .expect("every release measured")
            .with_context(|| format!("Figure {}, {}: U_san", spec.number, m.sanitization.label))?;
        u_san.push(row);
    }
    Ok(Researcher {
        u_base: baseline.u_base,
        u_base_by: format!(
            "{}, {}",
            baseline.u_base_classifier.name(),
            baseline.u_base_sanitization.name()
        ),
        u_san,
    })
}

pub fn run(args: FiguresArgs) -> anyhow::Result<()> {
    let formats = formats(&args.format)?;
    let sanitizations = sanitizations(
        args.k.as_deref().unwrap_or(&PAPER_K),
        args.l.as_deref().unwrap_or(&PAPER_L),
        args.t.as_deref().unwrap_or(&PAPER_T),
        args.delta.as_deref().unwrap_or(&PAPER_DELTA),
    );
    if sanitizations.is_empty() {
        bail!("no sanitization (rule: at least one of --k, --l, --t, --delta has a value)");
    }
    for s in &sanitizations {
        s.spec
            .validate()
            .with_context(|| format!("--{} {}", s.model, s.parameter))?;
    }
    let jobs = [
        (Dataset::Marital, "--marital", args.marital.as_deref()),
        (
            Dataset::Occupation,
            "--occupation",
            args.occupation.as_deref(),
        ),
    ];
    let numbers: Vec<u8> = match &args.figures {
        Some(numbers) => numbers.clone(),
        None => (1..=4)
            .filter(|&n| {
                let spec = FigureSpec::paper(n, None).expect("figures 1 to 4 exist");
                jobs.iter().any(|j| j.0 == spec.dataset && j.2.is_some())
            })
            .collect(),
    };
    if numbers.is_empty() {
        bail!("no figure to draw (rule: pass --marital JOB, --occupation JOB or both)");
    }
    let mut specs = Vec::new();
    for &n in &numbers {
        let neutral = match n {
            3 => Some(args.marital_workload.as_str()),
            4 => Some(args.occupation_workload.as_str()),
            _ => None,
        };
        let spec = FigureSpec::paper(n, neutral)
            .with_context(|| format!("--figures {n}: the paper has Figures 1 to 4"))?;
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot create the output directory", args.out.display()))?;
    if !args.no_learning {
        WorkloadOptions {
            folds: args.folds,
            ..WorkloadOptions::new("")
        }
        .validate()
        .context("--folds")?;
    }
    let mut figures: Vec<Figure> = Vec::new();
    for (dataset, flag, job_path) in jobs {
        let wanted: Vec<&FigureSpec> = specs.iter().filter(|s| s.dataset == dataset).collect();
        if wanted.is_empty() {
            continue;
        }
        let Some(job_path) = job_path else {
            bail!(
                "{flag}: Figure {} needs the {:?} dataset's job",
                wanted[0].number,
                dataset.name()
            );
        };
        let job = read_job(job_path)?;
        let table = load_table(&job, job_path, args.input.as_deref())?;
        check_dataset(&table, dataset).with_context(|| format!("{flag} {}", job_path.display()))?;
        for spec in &wanted {
            if !table.column_names().contains(&spec.workload.as_str()) {
                bail!(
                    "{}: Figure {} learns {}, which the job does not keep (rule: the workload is a column of the table)",
                    job_path.display(),
                    spec.number,
                    crate::text::quote(&spec.workload)
                );
            }
        }
        let mut measured = Vec::new();
        for (s, outcome) in
            sanitizations
                .iter()
                .zip(measure(&table, &sanitizations, job.seed, &job.algorithm))
        {
            match outcome {
                Ok(m) => measured.push(m),
                Err(reason) => eprintln!(
                    "cloakd: {} dataset, {}: left out: {reason}",
                    dataset.name(),
                    s.label
                ),
            }
        }
        for spec in wanted {
            let researcher = match args.no_learning {
                true => None,
                false => Some(researcher(&table, spec, &measured, &args)?),
            };
            let f = figure(spec, &table, &measured, researcher.as_ref())?;
            write_plot(&args.out, &spec.stem(), &Bars::of_figure(&f), &formats)?;
            figures.push(f);
        }
    }
    let csv_path = args.out.join("figures.csv");
    write_csv(&csv_path, &figures)?;
    print_table(&figures);
    eprintln!(
        "cloakd: {} figures; wrote {} and {} plots",
        figures.len(),
        csv_path.display(),
        figures.len() * formats.len()
    );
    Ok(())
}

/// The job's quasi-identifier and sensitive attribute must be the paper's for the dataset.
fn check_dataset(table: &Table, dataset: Dataset) -> anyhow::Result<()> {
    let mut quasi: Vec<&str> = table.quasi.iter().map(|q| q.name.as_str()).collect();
    quasi.sort_unstable();
    let mut expected = dataset.quasi();
    expected.sort_unstable();
    if quasi != expected || table.sensitive.name != dataset.sensitive() {
        bail!(
            "the {:?} dataset has Q = ({}) and S = {}, the job Q = ({}) and S = {} (rule: the paper's roles)",
            dataset.name(),
            dataset.quasi().join(", "),
            dataset.sensitive(),
            quasi.join(", "),
            table.sensitive.name
        );
    }
    Ok(())
}

/// The classifiers of `figures.csv`'s gain columns, in order.
const CLASSIFIERS: [&str; 3] = ["j48", "rf", "nb"];

/// `figures.csv`: one row per figure and sanitization; the utility columns are empty until
/// measured.
fn write_csv(path: &Path, figures: &[Figure]) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("{}: cannot create", path.display()))?;
    let mut csv = csv::Writer::from_writer(std::io::BufWriter::new(file));
    let mut header = vec![
        "figure",
        "dataset",
        "workload",
        "sanitization",
        "a_acc",
        "a_know",
        "adversary_baseline",
        "u_base",
    ];
    let gains: Vec<String> = CLASSIFIERS.iter().map(|c| format!("gain_{c}")).collect();
    header.extend(gains.iter().map(String::as_str));
    csv.write_record(&header)?;
    let number = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_default();
    for f in figures {
        for bar in &f.bars {
            let mut record = vec![
                f.spec.number.to_string(),
                f.spec.dataset.name().to_string(),
                f.spec.workload.clone(),
                bar.label.clone(),
                format!("{:.6}", bar.a_acc),
                format!("{:.6}", bar.a_know),
                format!("{:.6}", f.adversary_baseline),
                number(f.researcher_baseline.as_ref().map(|b| b.0)),
            ];
            for c in CLASSIFIERS {
                let gain = f
                    .spec
                    .classifiers
                    .iter()
                    .position(|x| x == c)
                    .and_then(|i| bar.utility_gain.get(i).copied().flatten());
                record.push(number(gain));
            }
            csv.write_record(&record)?;
        }
    }
    csv.flush()
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}

fn print_table(figures: &[Figure]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<6} {:<10} {:<14} {:<12} {:>8} {:>8}  U_san - U_base",
        "figure", "dataset", "workload", "sanitization", "a_acc", "a_know"
    );
    for f in figures {
        for bar in &f.bars {
            let gains: Vec<String> = f
                .spec
                .classifiers
                .iter()
                .zip(&bar.utility_gain)
                .map(|(c, g)| match g {
                    Some(g) => format!("{c} {g:+.4}"),
                    None => format!("{c} -"),
                })
                .collect();
            let _ = writeln!(
                out,
                "{:<6} {:<10} {:<14} {:<12} {:>8.4} {:>8.4}  {}",
                f.spec.number,
                f.spec.dataset.name(),
                f.spec.workload,
                bar.label,
                bar.a_acc,
                bar.a_know,
                gains.join(", ")
            );
        }
    }
}

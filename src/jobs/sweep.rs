//! The frontier's sweep, once for every caller: `cloakd table frontier` (a progress bar on stderr)
//! and the workbench's sweeps ([`crate::workbench`], a background job whose progress the
//! page polls). [`SweepPlan::new`] validates what the caller asked for (the CLI's flags, the API's
//! fields: the same names and defaults) into the releases to make; [`run_sweep`] anonymizes and
//! measures them on threads sharing the table, the measurement baseline and the learning baseline
//! read-only, reporting each finished release to a callback and stopping when a flag turns true.
//!
//! Invariants: a release's point depends only on the table, the job's roles, the plan and the
//! release's item (not on the threads or the order the releases finish in), so the CLI and the
//! workbench give the same points for the same job and sweep; a release a parameter makes
//! unsatisfiable is an `Err` with the reason, never a point; after the flag turns true no release
//! is started and the running ones stop at their engine's next look. A plan's size is bounded before
//! anything of it is built: each parameter list lists at most [`SweepLimits::max_values`] values
//! (`tables.max_sweep_values`) and loses its duplicates (the first of equal values stays), and the
//! sweep makes at most [`SweepLimits::max_points`] releases (`tables.max_sweep_points`); every
//! value is checked against its model's rules (k a whole number >= 1, l finite >= 1, t in [0, 1],
//! delta finite > 0). The releases' measurements charge the job's memory budget.
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use crate::budget::{MemoryBudget, bytes_of};
use crate::config::TablesConfig;
use crate::measures::evaluate::{Baseline, evaluate_unless};
use crate::measures::frontier::{FrontierPoint, SweepItem, SweptModel, sweep};
use crate::measures::workload::{DEFAULT_MAX_MODEL_CELLS, WorkloadBaseline};
use crate::relational::models::{Distance, PrivacySpec};
use crate::relational::ola::Metric;
use crate::relational::release::ReleaseMethod;
use crate::relational::table::Table;
use crate::relational::{Algorithm, AlgorithmOptions, AnonymizeError, anonymize_with};

/// What a sweep asks for, as the CLI's flags and the API's fields say it (`None`: the default set of
/// the model; an empty list leaves the model out).
#[derive(Debug, Clone, PartialEq)]
pub struct SweepOptions {
    pub k: Option<Vec<f64>>,
    pub l: Option<Vec<f64>>,
    pub t: Option<Vec<f64>>,
    pub delta: Option<Vec<f64>>,
    /// `js` (Li & Li, the default) or `emd`.
    pub t_distance: String,
    pub methods: Vec<String>,
    pub algorithms: Vec<String>,
    /// OLA's loss metric.
    pub metric: String,
    /// OLA's share of rows that may be suppressed.
    pub max_suppression: f64,
    pub seed: u64,
}

impl Default for SweepOptions {
    fn default() -> SweepOptions {
        SweepOptions {
            k: None,
            l: None,
            t: None,
            delta: None,
            t_distance: "js".into(),
            methods: vec!["generalization".into(), "bucketization".into()],
            algorithms: vec!["mondrian".into()],
            metric: "dm".into(),
            max_suppression: 0.0,
            seed: 7,
        }
    }
}

/// A sweep refused: the option (its API field name; the CLI's flag is `--` and the name with `-`
/// for `_`) and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}{}: {rule}", value.as_ref().map(|v| format!(" {v}")).unwrap_or_default())]
pub struct SweepError {
    pub field: &'static str,
    /// The refused value of a list, when one is at fault.
    pub value: Option<String>,
    pub rule: String,
}

fn refuse(field: &'static str, rule: impl Into<String>) -> SweepError {
    SweepError {
        field,
        value: None,
        rule: rule.into(),
    }
}

/// The API field (and flag) of a swept model's parameters.
pub fn model_field(model: SweptModel) -> &'static str {
    match model {
        SweptModel::K => "k",
        SweptModel::L => "l",
        SweptModel::T => "t",
        SweptModel::Delta => "delta",
    }
}

/// How large a sweep may be (`tables.max_sweep_values`, `tables.max_sweep_points`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepLimits {
    /// Most values one parameter list may give (duplicates included).
    pub max_values: usize,
    /// Most releases of one sweep.
    pub max_points: usize,
}

impl SweepLimits {
    pub fn of(config: &TablesConfig) -> SweepLimits {
        SweepLimits {
            max_values: config.max_sweep_values,
            max_points: config.max_sweep_points,
        }
    }
}

/// `values` without duplicates (the first of equal values stays; -0 equals 0).
fn distinct(values: &[f64]) -> Vec<f64> {
    let mut seen = std::collections::HashSet::new();
    values
        .iter()
        .copied()
        .filter(|v| seen.insert((v + 0.0).to_bits()))
        .collect()
}

/// The releases of a sweep and how each is made.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPlan {
    pub items: Vec<SweepItem>,
    /// Pairs of method and algorithm left out (KACA and OLA generalize only).
    pub left_out: Vec<(ReleaseMethod, Algorithm)>,
    pub seed: u64,
    pub metric: Metric,
    pub max_suppression: f64,
    pub t_distance: Distance,
}

impl SweepPlan {
    /// Validates the options (every parameter against its model's rules, the sizes against
    /// `limits`) into the sweep's items.
    pub fn new(options: &SweepOptions, limits: SweepLimits) -> Result<SweepPlan, SweepError> {
        for (field, list) in [
            ("k", &options.k),
            ("l", &options.l),
            ("t", &options.t),
            ("delta", &options.delta),
            ("methods", &None),
            ("algorithms", &None),
        ] {
            let given = match field {
                "methods" => options.methods.len(),
                "algorithms" => options.algorithms.len(),
                _ => list.as_ref().map_or(0, Vec::len),
            };
            if given > limits.max_values {
                return Err(refuse(
                    field,
                    format!(
                        "lists {given} values, more than tables.max_sweep_values = {} (rule: each list of a sweep gives at most tables.max_sweep_values values)",
                        limits.max_values
                    ),
                ));
            }
        }
        let t_distance = match options.t_distance.as_str() {
            "js" => Distance::Js,
            "emd" => Distance::Emd,
            other => {
                return Err(refuse(
                    "t_distance",
                    format!(
                        "unknown distance {} (known: js, emd)",
                        crate::text::quote(other)
                    ),
                ));
            }
        };
        let metric: Metric = options
            .metric
            .parse()
            .map_err(|e: String| refuse("metric", e))?;
        if !(0.0..=1.0).contains(&options.max_suppression) {
            return Err(refuse(
                "max_suppression",
                format!("{} must lie in [0, 1]", options.max_suppression),
            ));
        }
        let mut methods = Vec::new();
        for name in &options.methods {
            let method: ReleaseMethod = name.parse().map_err(|e: String| refuse("methods", e))?;
            if !methods.contains(&method) {
                methods.push(method);
            }
        }
        let mut plan = SweepPlan {
            items: Vec::new(),
            left_out: Vec::new(),
            seed: options.seed,
            metric,
            max_suppression: options.max_suppression,
            t_distance,
        };
        let mut algorithms: Vec<Algorithm> = Vec::new();
        for name in &options.algorithms {
            let algorithm: Algorithm = name.parse().map_err(|e: String| refuse("algorithms", e))?;
            plan.algorithm_options(algorithm)
                .validate(ReleaseMethod::Generalization)
                .map_err(|e| refuse("algorithms", format!("{algorithm}: {e}")))?;
            if !algorithms.contains(&algorithm) {
                algorithms.push(algorithm);
            }
        }
        let chosen = |model: SweptModel, given: &Option<Vec<f64>>| {
            (
                model,
                distinct(&given.clone().unwrap_or_else(|| model.default_parameters())),
            )
        };
        let parameters = [
            chosen(SweptModel::K, &options.k),
            chosen(SweptModel::L, &options.l),
            chosen(SweptModel::T, &options.t),
            chosen(SweptModel::Delta, &options.delta),
        ];
        for (model, values) in &parameters {
            for &value in values {
                if *model == SweptModel::K && !(value >= 1.0 && value.fract() == 0.0) {
                    return Err(SweepError {
                        field: "k",
                        value: Some(value.to_string()),
                        rule: "k must be a whole number >= 1".into(),
                    });
                }
                plan.privacy_of(*model, value)
                    .validate()
                    .map_err(|e| SweepError {
                        field: model_field(*model),
                        value: Some(value.to_string()),
                        rule: e.to_string(),
                    })?;
            }
        }
        let values: usize = parameters.iter().map(|(_, v)| v.len()).sum();
        let points = values
            .saturating_mul(methods.len())
            .saturating_mul(algorithms.len());
        if points > limits.max_points {
            return Err(refuse(
                "sweep",
                format!(
                    "{values} distinct parameter values x {} methods x {} algorithms make {points} releases, more than tables.max_sweep_points = {} (rule: a sweep makes at most tables.max_sweep_points releases)",
                    methods.len(),
                    algorithms.len(),
                    limits.max_points
                ),
            ));
        }
        let valid = |method, algorithm| plan.algorithm_options(algorithm).validate(method).is_ok();
        let mut left_out = Vec::new();
        for &method in &methods {
            for &algorithm in &algorithms {
                if !valid(method, algorithm) {
                    left_out.push((method, algorithm));
                }
            }
        }
        let items = sweep(&parameters, &methods, &algorithms, valid);
        plan.items = items;
        plan.left_out = left_out;
        if plan.items.is_empty() {
            return Err(refuse(
                "sweep",
                "the sweep is empty (rule: at least one parameter, one method and one algorithm that releases by it)",
            ));
        }
        Ok(plan)
    }

    /// The algorithm options of one algorithm of the sweep: `metric` and `max_suppression` apply to
    /// OLA only.
    pub fn algorithm_options(&self, algorithm: Algorithm) -> AlgorithmOptions {
        AlgorithmOptions {
            algorithm,
            metric: self.metric,
            max_suppression: if algorithm == Algorithm::Ola {
                self.max_suppression
            } else {
                0.0
            },
            ..AlgorithmOptions::default()
        }
    }

    fn privacy_of(&self, model: SweptModel, parameter: f64) -> PrivacySpec {
        model.spec_with(parameter, self.t_distance)
    }

    /// The privacy requirement of one release.
    pub fn privacy(&self, item: &SweepItem) -> PrivacySpec {
        self.privacy_of(item.model, item.parameter)
    }
}

/// Anonymizes and measures one release of the sweep (and learns its workload, when given); `Ok(None)`
/// when `cancelled` turned true first.
pub fn measure_release(
    table: &Table,
    baseline: &Baseline,
    learning: Option<&WorkloadBaseline>,
    plan: &SweepPlan,
    item: SweepItem,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
) -> Result<Option<FrontierPoint>, String> {
    let started = Instant::now();
    let (release, report) = match anonymize_with(
        table,
        &plan.privacy(&item),
        item.method,
        plan.seed,
        &plan.algorithm_options(item.algorithm),
        cancelled,
    ) {
        Ok(done) => done,
        Err(AnonymizeError::Cancelled) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let Some(evaluation) =
        evaluate_unless(table, baseline, &release, usize::MAX, budget, cancelled)
            .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let workload = match learning {
        Some(learning) => {
            let _datasets = budget
                .try_reserve(
                    crate::measures::workload::datasets_bytes(table),
                    "the learning workload's datasets of a release",
                )
                .map_err(|e| format!("workload: {e}"))?;
            match learning
                .measure_unless(table, &release, DEFAULT_MAX_MODEL_CELLS, cancelled)
                .map_err(|e| format!("workload: {e}"))?
            {
                Some(w) => Some(w),
                None if cancelled.load(Ordering::Relaxed) => return Ok(None),
                None => None,
            }
        }
        None => None,
    };
    Ok(Some(FrontierPoint {
        item,
        evaluation,
        seconds: started.elapsed().as_secs_f64(),
        efficient: false,
        workload,
        distortion: report.distortion,
        risk: release_risk(&release)?,
    }))
}

/// The release's prosecutor risk on its released quasi-identifiers (`None` when every record is
/// suppressed); linear in the rows, its memory that of the release's QI codes.
fn release_risk(
    release: &crate::relational::release::Release,
) -> Result<Option<crate::measures::frontier::ReleaseRisk>, String> {
    let profile = super::release_report::release_risk(release).map_err(|e| format!("risk: {e}"))?;
    Ok(match profile.prosecutor {
        crate::risk::Measured::Value(p) => Some(crate::measures::frontier::ReleaseRisk {
            highest: p.highest,
            average: p.average,
            records_at_risk: p.records_at_risk,
        }),
        crate::risk::Measured::Unavailable { .. } => None,
    })
}

/// One release's outcome: its point, or why it was left out.
pub type Outcome = Result<FrontierPoint, String>;

/// Makes every release of `plan` on `threads` threads (one release per thread at a time); each
/// finished release is handed to `on_release` with its index in `plan.items`. Returns the outcome
/// per item, `None` for a release not made because `cancelled` turned true; refused before the
/// outcomes' list would pass `budget`.
#[allow(clippy::too_many_arguments)]
pub fn run_sweep(
    table: &Table,
    baseline: &Baseline,
    learning: Option<&WorkloadBaseline>,
    plan: &SweepPlan,
    threads: usize,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
    on_release: &(dyn Fn(usize, &Outcome) + Sync),
) -> Result<Vec<Option<Outcome>>, crate::budget::BudgetExceeded> {
    let _outcomes_held = budget.try_reserve(
        bytes_of(plan.items.len(), std::mem::size_of::<Option<Outcome>>()),
        "the sweep's outcomes",
    )?;
    let threads = threads.clamp(1, plan.items.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; plan.items.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    if cancelled.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&item) = plan.items.get(i) else {
                        break;
                    };
                    let outcome = match measure_release(
                        table, baseline, learning, plan, item, budget, cancelled,
                    ) {
                        Ok(Some(point)) => Ok(point),
                        Ok(None) => break,
                        Err(reason) => Err(reason),
                    };
                    on_release(i, &outcome);
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(outcome);
                    }
                }
            });
        }
    });
    Ok(results.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// The machine's parallelism (the CLI's `--threads` default, and the workbench's).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

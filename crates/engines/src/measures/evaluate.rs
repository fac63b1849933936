//! The privacy/utility evaluation of one release against its original table: Ploss, A_know, A_acc
//! (over the release's classes), Uloss (large populations), aggregate COUNT query error, and the
//! syntactic measures discernibility and average class size (taken from the release report, the one
//! place they are defined).
//!
//! Invariants: the [`Baseline`] (large populations with their true distributions, the query workload
//! with its true answers) depends only on the original table and the options, so it is computed once
//! and shared by every release measured against the same table (the frontier); measuring a release
//! reads nothing but the release and the baseline.
//!
//! Memory: the baseline and each measurement charge the job's [`MemoryBudget`]. Uloss degrades:
//! when its large populations (or a release's estimates of them) cannot fit, the evaluation
//! completes with `uloss` absent and `uloss_unavailable` saying what needed the memory; the other
//! measures are bounded by their own limits (the view's histograms, the query count) and fail the
//! job when past them.
use std::sync::atomic::AtomicBool;

use crate::budget::MemoryBudget;

use serde::Serialize;

use crate::measures::populations::LargePopulations;
use crate::measures::privacy::privacy_loss;
use crate::measures::queries::QueryWorkload;
use crate::measures::view::{ReleaseView, ViewError};
use crate::relational::models::PrivacySpec;
use crate::relational::release::Release;
use crate::relational::report::{self, ReportError};
use crate::relational::table::Table;

/// Parameters of the utility measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvaluationOptions {
    /// Minimum support of a large population, as a fraction of the table (Li & Li: 0.05).
    pub min_support: f64,
    /// Number of COUNT queries.
    pub queries: usize,
    /// QI predicates per query.
    pub qd: usize,
    /// Fraction of each attribute's values a predicate selects.
    pub sel: f64,
    /// Seed of the query workload.
    pub seed: u64,
}

impl Default for EvaluationOptions {
    fn default() -> EvaluationOptions {
        EvaluationOptions {
            min_support: 0.05,
            queries: 1000,
            qd: 4,
            sel: 0.05,
            seed: 1,
        }
    }
}

/// Why options were rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{option} = {value}: {rule}")]
pub struct OptionsError {
    pub option: &'static str,
    pub value: String,
    pub rule: &'static str,
}

impl EvaluationOptions {
    pub fn validate(&self) -> Result<(), OptionsError> {
        if !(self.min_support > 0.0 && self.min_support <= 1.0) {
            return Err(OptionsError {
                option: "min_support",
                value: self.min_support.to_string(),
                rule: "a fraction of the table in (0, 1]",
            });
        }
        if !(self.sel > 0.0 && self.sel <= 1.0) {
            return Err(OptionsError {
                option: "sel",
                value: self.sel.to_string(),
                rule: "a fraction of the values in (0, 1]",
            });
        }
        if self.qd == 0 {
            return Err(OptionsError {
                option: "qd",
                value: "0".into(),
                rule: "at least one QI predicate per query",
            });
        }
        Ok(())
    }
}

/// What the measures need from the original table, computed once.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub options: EvaluationOptions,
    pub populations: LargePopulations,
    /// Why the large populations could not be mined (then `populations` is empty and every
    /// evaluation's Uloss is unavailable).
    pub uloss_unavailable: Option<String>,
    pub workload: QueryWorkload,
}

impl Baseline {
    pub fn new(table: &Table, options: EvaluationOptions) -> Result<Baseline, OptionsError> {
        let never = AtomicBool::new(false);
        Ok(
            Self::new_unless(table, options, &MemoryBudget::unlimited(), &never)?
                .expect("a baseline that cannot be cancelled completes"),
        )
    }

    /// [`Baseline::new`], giving up (`Ok(None)`) soon after `cancelled` turns true: the daemon
    /// sets it when the caller goes away or its deadline passes. Large populations that would pass
    /// `budget` are left out (`uloss_unavailable` says why).
    pub fn new_unless(
        table: &Table,
        options: EvaluationOptions,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<Option<Baseline>, OptionsError> {
        options.validate()?;
        let (populations, uloss_unavailable) =
            match LargePopulations::mine_within(table, options.min_support, budget, cancelled) {
                Ok(Some(populations)) => (populations, None),
                Ok(None) => return Ok(None),
                Err(e) => (
                    LargePopulations::none(table, options.min_support),
                    Some(e.to_string()),
                ),
            };
        let Some(workload) = QueryWorkload::generate_unless(
            table,
            options.queries,
            options.qd,
            options.sel,
            options.seed,
            cancelled,
        ) else {
            return Ok(None);
        };
        Ok(Some(Baseline {
            options,
            populations,
            uloss_unavailable,
            workload,
        }))
    }
}

/// The evaluation of one release (the JSON report of `cloakd table evaluate`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Evaluation {
    /// Worst-case JS divergence between Q and a class's sensitive distribution (natural log).
    pub ploss: f64,
    /// Mean JS divergence over the large populations; `None` when they could not be measured
    /// within the job's memory (`uloss_unavailable` says why).
    pub uloss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uloss_unavailable: Option<String>,
    pub a_know: f64,
    pub a_acc: f64,
    /// Mean relative error of the COUNT queries (a fraction; Li & Li plot it × 100).
    pub query_error: f64,
    pub discernibility: f64,
    pub avg_class_size: f64,
    pub rows: u64,
    pub classes: u64,
    pub large_populations: u64,
    pub min_support: f64,
    pub queries: u64,
    pub qd: u64,
    pub sel: f64,
}

/// Why a release could not be measured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvaluateError {
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("release: {0}")]
    Report(#[from] ReportError),
    #[error(
        "the release has {release} rows but the original table {table} (rule: a release publishes every row of its table)"
    )]
    RowCount { release: u64, table: u64 },
    /// The job's memory budget refused the release's histograms.
    #[error(transparent)]
    Memory(#[from] crate::budget::BudgetExceeded),
}

/// Measures a release against its original table.
pub fn evaluate(
    table: &Table,
    baseline: &Baseline,
    release: &Release,
) -> Result<Evaluation, EvaluateError> {
    let never = AtomicBool::new(false);
    Ok(evaluate_unless(
        table,
        baseline,
        release,
        usize::MAX,
        &MemoryBudget::unlimited(),
        &never,
    )?
    .expect("an evaluation that cannot be cancelled completes"))
}

/// [`evaluate`], giving up (`Ok(None)`) soon after `cancelled` turns true, and refusing
/// ([`ViewError::TooLarge`]) a release whose class and cell histograms would pass
/// `max_histogram_cells` counts, or what is left of `budget`, before allocating them. Uloss is
/// unavailable when its estimates would pass `budget`.
pub fn evaluate_unless(
    table: &Table,
    baseline: &Baseline,
    release: &Release,
    max_histogram_cells: usize,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
) -> Result<Option<Evaluation>, EvaluateError> {
    // The class and cell histograms, 8 bytes a count (two lists of them at most).
    let left = budget.limit().saturating_sub(budget.held()) / 16;
    let cells = max_histogram_cells.min(usize::try_from(left).unwrap_or(usize::MAX));
    let view = ReleaseView::new_within(table, release, cells)?;
    let _view_held = budget.try_reserve(
        view.histogram_bytes(),
        "the release's class and cell histograms",
    )?;
    if view.rows() != table.rows() as u64 {
        return Err(EvaluateError::RowCount {
            release: view.rows(),
            table: table.rows() as u64,
        });
    }
    let Some(report) = report::evaluate_unless(
        release,
        "evaluated",
        &PrivacySpec::default().models(),
        cancelled,
    )?
    else {
        return Ok(None);
    };
    let privacy = privacy_loss(&view.class_histograms, view.domain);
    let Some(query_error) = baseline
        .workload
        .relative_error_unless(table, &view, cancelled)
    else {
        return Ok(None);
    };
    let (uloss, uloss_unavailable) = match &baseline.uloss_unavailable {
        Some(reason) => (None, Some(reason.clone())),
        None => match baseline
            .populations
            .uloss_within(table, &view, budget, cancelled)
        {
            Ok(Some(uloss)) => (Some(uloss), None),
            Ok(None) => return Ok(None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Ok(Some(Evaluation {
        ploss: privacy.ploss,
        uloss,
        uloss_unavailable,
        a_know: privacy.a_know,
        a_acc: privacy.a_acc,
        query_error,
        discernibility: report.discernibility,
        avg_class_size: report.avg_class_size,
        rows: view.rows(),
        classes: view.classes() as u64,
        large_populations: baseline.populations.len() as u64,
        min_support: baseline.options.min_support,
        queries: baseline.workload.queries.len() as u64,
        qd: baseline.workload.qd as u64,
        sel: baseline.workload.sel,
    }))
}

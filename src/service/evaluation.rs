//! gRPC `TableEvaluator`: the privacy/utility evaluation of `cloakd table evaluate` over the wire.
//! The request carries the job (TOML), its hierarchies, the original table and the release inline;
//! the measurement runs on a blocking thread.
//!
//! Invariants: uploads (after gzip decoding) are bounded by `tables.max_bytes`, the table by
//! `tables.max_rows`, the query workload by `tables.max_queries` and the release's class and cell
//! histograms (classes × sensitive values) and the learning workload's models (classes × attribute
//! values) by `tables.max_bytes` too (8 bytes a cell), each checked before anything of that size is
//! allocated; the workload's options are validated (and refused without `workload`) before the job
//! takes a place or decodes an upload; evaluations hold a place of the one table-job limiter
//! (`tables.max_concurrent_jobs`, shared with TableAnonymizer), further ones get RESOURCE_EXHAUSTED;
//! a call whose client goes away or whose deadline (or `tables.max_job_ms`) passes stops its
//! measurement (mining, query workload, Uloss, the workload's learning between folds) and frees its
//! place; the workload's figures are those of `cloakd table evaluate --workload`
//! ([`measure_workload_unless`] for both);
//! every call computes within a memory budget of its own (`tables.max_job_bytes`): its decoded
//! uploads and parsed tables are charged before they are read, a measurement past it ends with
//! RESOURCE_EXHAUSTED naming the key, except Uloss, which is then left unset with
//! `uloss_unavailable` saying why;
//! malformed input is INVALID_ARGUMENT with the file, line and rule.
use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::Status;

use crate::budget::{BudgetExceeded, MemoryBudget, ReadWithin, Reservation, read_to_end_within};

use crate::config::TablesConfig;
use crate::connections::LimitExceeded;
use crate::jobs::JobStopped;
use crate::jobs::{JobFailure, JobRecord, Outcome, TABLE_BYTES_PER_CSV_BYTE, TableJobs};
use crate::measures::evaluate::{Baseline, EvaluateError, EvaluationOptions, evaluate_unless};
use crate::measures::released::read_release;
use crate::measures::view::ViewError;
use crate::measures::workload::{
    WorkloadError, WorkloadEvaluation, WorkloadOptions, measure_workload_unless,
};
use crate::proto::table_evaluator_server::{TableEvaluator, TableEvaluatorServer};
use crate::proto::{ClassifierWorkload, EvaluateRequest, EvaluateResponse, Workload};
use crate::relational::hierarchy::Hierarchy;
use crate::relational::job::JobSpec;
use crate::relational::release::{Release, ReleasedRole};
use crate::relational::table::read_csv;
use crate::risk::RiskOptions;
use crate::service::evaluation_risk::{
    SudaCheck, check_suda, risk_bytes, risk_options, risk_response, suda_bytes,
};
use crate::service::job_status;
use crate::text::quote;

/// Why an evaluation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum EvaluationError {
    /// Malformed input: the message names the field (file), line and rule.
    #[error("{0}")]
    Invalid(String),
    #[error("{field}: {got} is more than {limit} = {max}")]
    TooLarge {
        field: &'static str,
        got: u64,
        limit: &'static str,
        max: u64,
    },
    #[error("tables.max_concurrent_jobs: {0}")]
    Busy(#[from] LimitExceeded),
    #[error("the evaluation was cancelled (the caller went away or its deadline passed)")]
    Cancelled,
    #[error("tables.max_job_ms: {0}")]
    Stopped(#[from] JobStopped),
    /// The job's memory budget (`tables.max_job_bytes`) refused an allocation.
    #[error("{0}")]
    Memory(#[from] BudgetExceeded),
    /// The learning workload refused its options, its attribute or a model's size.
    #[error("workload: {0}")]
    Workload(WorkloadError),
    /// SUDA's size refused: above the release's quasi-identifiers, or past the search's limits.
    #[error(transparent)]
    Suda(#[from] SudaCheck),
    #[error("evaluation failed: {0}")]
    Internal(String),
}

impl EvaluationError {
    /// The error's class ([`JobFailure`]).
    fn failure(&self) -> JobFailure {
        match self {
            EvaluationError::Invalid(_) => JobFailure::Invalid,
            // The model's cells are 8-byte counts, limited like the histograms.
            EvaluationError::Workload(WorkloadError::TooLarge { .. })
            | EvaluationError::TooLarge { .. }
            | EvaluationError::Busy(_)
            | EvaluationError::Suda(SudaCheck::Search(_))
            | EvaluationError::Memory(_) => JobFailure::Exhausted,
            EvaluationError::Suda(SudaCheck::AboveQuasi { .. }) => JobFailure::Invalid,
            EvaluationError::Workload(
                WorkloadError::Option { .. }
                | WorkloadError::NoAttribute(..)
                | WorkloadError::Group { .. }
                | WorkloadError::Learning(_),
            ) => JobFailure::Invalid,
            EvaluationError::Cancelled => JobFailure::Cancelled,
            EvaluationError::Stopped(e) => JobFailure::of_stopped(e),
            EvaluationError::Internal(_) => JobFailure::Internal,
        }
    }
}

impl From<EvaluationError> for Status {
    fn from(err: EvaluationError) -> Status {
        let message = match &err {
            EvaluationError::Workload(WorkloadError::TooLarge {
                classes,
                values,
                needed,
                max,
            }) => format!(
                "workload: a model of {classes} classes over {values} attribute values needs {needed} cells of 8 bytes, more than tables.max_bytes / 8 = {max} (rule: the workload's models within tables.max_bytes)"
            ),
            err => err.to_string(),
        };
        job_status(err.failure(), message)
    }
}

fn invalid(message: impl std::fmt::Display) -> EvaluationError {
    EvaluationError::Invalid(message.to_string())
}

/// The evaluator service.
#[derive(Debug, Clone)]
pub struct Evaluator {
    max_rows: usize,
    max_bytes: usize,
    max_queries: usize,
    jobs: TableJobs,
}

/// The `TableEvaluator` server with the limits of `config`; `jobs` is the table-job limiter shared
/// with TableAnonymizer and the workbench ([`TableJobs`]).
pub fn table_evaluator(config: &TablesConfig, jobs: TableJobs) -> TableEvaluatorServer<Evaluator> {
    TableEvaluatorServer::new(Evaluator {
        max_rows: config.max_rows,
        max_bytes: config.max_bytes,
        max_queries: config.max_queries,
        jobs,
    })
    .max_decoding_message_size(config.max_bytes.saturating_add(1 << 20))
}

/// Plain bytes of an upload that may be gzip-compressed, at most `limit` bytes once decoded; a
/// plain upload is read in place, a compressed one decoded charging `held` as it grows.
fn decoded<'a>(
    name: &'static str,
    bytes: &'a [u8],
    limit: usize,
    held: &mut Reservation,
) -> Result<std::borrow::Cow<'a, [u8]>, EvaluationError> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    let decoder = flate2::read::MultiGzDecoder::new(bytes);
    let out = read_to_end_within(decoder, limit, held, name).map_err(|e| match e {
        ReadWithin::Memory(e) => EvaluationError::Memory(e),
        ReadWithin::TooLarge(_) => EvaluationError::TooLarge {
            field: name,
            got: limit as u64 + 1,
            limit: "tables.max_bytes (bytes once decompressed)",
            max: limit as u64,
        },
        ReadWithin::Io(e) => invalid(format!("{name}: not valid gzip: {e}")),
    })?;
    Ok(std::borrow::Cow::Owned(out))
}

/// The request's learning workload, validated; `None` without `workload`, whose options are then
/// refused.
fn workload_options(request: &EvaluateRequest) -> Result<Option<WorkloadOptions>, EvaluationError> {
    let Some(attribute) = &request.workload else {
        let stray = [
            (!request.classifiers.is_empty()).then_some("classifiers"),
            request.folds.map(|_| "folds"),
            request.workload_seed.map(|_| "workload_seed"),
        ];
        return match stray.into_iter().flatten().next() {
            Some(field) => Err(invalid(format!(
                "{field}: set without workload (rule: the workload options need workload, the attribute to learn)"
            ))),
            None => Ok(None),
        };
    };
    let classifiers =
        (!request.classifiers.is_empty()).then(|| request.classifiers.iter().map(String::as_str));
    WorkloadOptions::parse(
        attribute,
        classifiers,
        request.folds.map(|f| f as usize),
        request.workload_seed,
    )
    .map(Some)
    .map_err(EvaluationError::Workload)
}

fn workload_response(w: WorkloadEvaluation) -> Workload {
    Workload {
        attribute: w.attribute,
        folds: w.folds,
        seed: w.seed,
        u_max: w.u_max,
        u_base: w.u_base,
        u_base_sanitization: w.u_base_sanitization.name().to_string(),
        u_base_classifier: w.u_base_classifier.name().to_string(),
        classifiers: w
            .classifiers
            .into_iter()
            .map(|c| ClassifierWorkload {
                classifier: c.classifier.name().to_string(),
                u_max: c.u_max,
                u_san: c.u_san,
                u_san_minus_u_base: c.u_san_minus_u_base,
            })
            .collect(),
    }
}

impl Evaluator {
    /// The request's options, every size checked against its limit before anything is allocated.
    fn options(&self, request: &EvaluateRequest) -> Result<EvaluationOptions, EvaluationError> {
        let defaults = EvaluationOptions::default();
        let queries = request.queries.map_or(defaults.queries as u64, u64::from);
        if queries > self.max_queries as u64 {
            return Err(EvaluationError::TooLarge {
                field: "queries",
                got: queries,
                limit: "tables.max_queries",
                max: self.max_queries as u64,
            });
        }
        Ok(EvaluationOptions {
            min_support: request.min_support.unwrap_or(defaults.min_support),
            queries: queries as usize,
            qd: request.qd.map_or(defaults.qd, |q| q as usize),
            sel: request.sel.unwrap_or(defaults.sel),
            seed: request.query_seed.unwrap_or(defaults.seed),
        })
    }

    fn run(
        &self,
        request: EvaluateRequest,
        options: EvaluationOptions,
        workload: Option<WorkloadOptions>,
        risk: RiskOptions,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<EvaluateResponse, EvaluationError> {
        let (max_rows, max_bytes) = (self.max_rows, self.max_bytes);
        let mut held = budget.reservation();
        let job = JobSpec::parse("job_toml", &request.job_toml).map_err(invalid)?;
        let hierarchies: HashMap<&str, &str> = request
            .hierarchies
            .iter()
            .map(|h| (h.path.as_str(), h.text.as_str()))
            .collect();
        let schema = job.schema(|path, column| -> Result<Hierarchy, EvaluationError> {
            let text = hierarchies.get(path).ok_or_else(|| {
                invalid(format!(
                    "hierarchy {} of column {} is not in the request (rule: send every hierarchy the job names)",
                    quote(path),
                    quote(column)
                ))
            })?;
            Hierarchy::parse(path, text).map_err(invalid)
        })?;
        let original = decoded("original_csv", &request.original_csv, max_bytes, &mut held)?;
        held.grow(
            (original.len() as u64).saturating_mul(TABLE_BYTES_PER_CSV_BYTE),
            "original_csv (the parsed table)",
        )?;
        let table = read_csv(schema, &*original, "original_csv", job.delimiter).map_err(invalid)?;
        if table.rows() > max_rows {
            return Err(EvaluationError::TooLarge {
                field: "original_csv",
                got: table.rows() as u64,
                limit: "tables.max_rows",
                max: max_rows as u64,
            });
        }
        let release_bytes = decoded("release_csv", &request.release_csv, max_bytes, &mut held)?;
        let sensitive_bytes = decoded(
            "sensitive_csv",
            &request.sensitive_csv,
            max_bytes,
            &mut held,
        )?;
        held.grow(
            ((release_bytes.len() + sensitive_bytes.len()) as u64)
                .saturating_mul(TABLE_BYTES_PER_CSV_BYTE),
            "release_csv (the parsed release)",
        )?;
        let mut sensitive_reader: &[u8] = &sensitive_bytes;
        let release = read_release(
            &table,
            &*release_bytes,
            "release_csv",
            (!sensitive_bytes.is_empty())
                .then_some((&mut sensitive_reader as &mut dyn Read, "sensitive_csv")),
            job.delimiter,
        )
        .map_err(invalid)?;
        let baseline = Baseline::new_unless(&table, options, budget, cancelled)
            .map_err(invalid)?
            .ok_or(EvaluationError::Cancelled)?;
        // The view's histograms (8-byte counts) may take at most `tables.max_bytes`, like an upload.
        let max_cells = max_bytes / 8;
        let e = evaluate_unless(&table, &baseline, &release, max_cells, budget, cancelled)
            .map_err(|e| match e {
                EvaluateError::View(ViewError::TooLarge { classes, domain, .. }) => {
                    EvaluationError::TooLarge {
                        field: "release_csv",
                        got: (classes as u64).saturating_mul(domain as u64).saturating_mul(8),
                        limit: "tables.max_bytes (bytes of the release's class histograms, 8 per class and sensitive value, or more)",
                        max: max_bytes as u64,
                    }
                }
                EvaluateError::Memory(e) => EvaluationError::Memory(e),
                other => invalid(other),
            })?
            .ok_or(EvaluationError::Cancelled)?;
        let risk = release_risk(&release, &risk, budget, cancelled)?;
        let _datasets = match &workload {
            Some(_) => Some(budget.try_reserve(
                crate::measures::workload::datasets_bytes(&table).saturating_mul(2),
                "the learning workload's datasets (the table's and the release's)",
            )?),
            None => None,
        };
        let workload = match workload {
            Some(options) => Some(workload_response(
                measure_workload_unless(&table, &release, options, max_cells, cancelled)
                    .map_err(EvaluationError::Workload)?
                    .ok_or(EvaluationError::Cancelled)?,
            )),
            None => None,
        };
        Ok(EvaluateResponse {
            ploss: e.ploss,
            uloss: e.uloss,
            uloss_unavailable: e.uloss_unavailable,
            a_know: e.a_know,
            a_acc: e.a_acc,
            query_error: e.query_error,
            discernibility: e.discernibility,
            avg_class_size: e.avg_class_size,
            rows: e.rows,
            classes: e.classes,
            large_populations: e.large_populations,
            queries: e.queries,
            workload,
            risk: Some(risk),
        })
    }

    async fn evaluate_request(
        &self,
        request: EvaluateRequest,
    ) -> Result<EvaluateResponse, EvaluationError> {
        let upload =
            request.original_csv.len() + request.release_csv.len() + request.sensitive_csv.len();
        if upload > self.max_bytes {
            return Err(EvaluationError::TooLarge {
                field: "original_csv + release_csv + sensitive_csv",
                got: upload as u64,
                limit: "tables.max_bytes",
                max: self.max_bytes as u64,
            });
        }
        let options = self.options(&request)?;
        let workload = workload_options(&request)?;
        let risk = risk_options(&request).map_err(EvaluationError::Invalid)?;
        let slot = self.jobs.acquire()?;
        let evaluator = self.clone();
        let stopped = |e: &EvaluationError| matches!(e, EvaluationError::Cancelled);
        let (evaluation, _slot) = self
            .jobs
            .run("evaluate", slot, stopped, move |cancelled, budget| {
                evaluator.run(request, options, workload, risk, budget, cancelled)
            })
            .await?;
        evaluation
    }
}

/// The release's risk section: SUDA's size checked and the memory charged to the job's budget first,
/// the cancellation flag looked at before and after (the profile is linear in the rows, SUDA's search
/// bounded by its checked size; neither is interrupted).
fn release_risk(
    release: &Release,
    options: &RiskOptions,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
) -> Result<crate::proto::Risk, EvaluationError> {
    let quasi = release.quasi_table();
    let qis = quasi
        .columns
        .iter()
        .filter(|c| c.role == ReleasedRole::Quasi)
        .count();
    check_suda(options, quasi.rows, qis)?;
    let _held = budget.try_reserve(
        risk_bytes(quasi.rows, qis),
        "the risk profile (the release's quasi-identifier codes and classes)",
    )?;
    let _suda = match options.suda_max_size.filter(|_| options.suda) {
        Some(max) => Some(budget.try_reserve(
            suda_bytes(quasi.rows, qis, max),
            "SUDA (the uniqueness bitsets of two levels of its search, the records' scores)",
        )?),
        None => None,
    };
    if cancelled.load(Ordering::Relaxed) {
        return Err(EvaluationError::Cancelled);
    }
    let profile = crate::risk::profile(&crate::risk::classes::of_release(quasi), options, None)
        .map_err(invalid)?;
    if cancelled.load(Ordering::Relaxed) {
        return Err(EvaluationError::Cancelled);
    }
    Ok(risk_response(&profile, options))
}

#[tonic::async_trait]
impl TableEvaluator for Evaluator {
    async fn evaluate(
        &self,
        request: tonic::Request<EvaluateRequest>,
    ) -> Result<tonic::Response<EvaluateResponse>, Status> {
        // Dropped unfinished (counted as cancelled) when tonic drops this future.
        let record = JobRecord::start("evaluate");
        let result = self.evaluate_request(request.into_inner()).await;
        record.finish(Outcome::of(
            result.as_ref().map_err(EvaluationError::failure),
        ));
        result.map(tonic::Response::new).map_err(Status::from)
    }
}
